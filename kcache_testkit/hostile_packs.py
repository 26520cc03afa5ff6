"""Hostile kernel packs made from real ones, for the service's hardening tests and
``bench/hostile_memory.py``: decompression amplifiers, malformed tar and zstd layers, and a
seeded mutation fuzzer. Nothing here checks anything; the tests do.

Everything is built by hand (tarfile + zstandard), bypassing ``build_pack``'s checks, and
streamed where it is big: a pack whose ``.cubin`` is 900 MiB of zeros is made without ever
holding 900 MiB.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path

import zstandard
from kcache_schemas import KernelManifest
from kcache_schemas.pack import MANIFEST_NAME

_CHUNK = 1 << 20


def _member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def _pad(n: int) -> bytes:
    return bytes(-n % 512)


def _zeros(size: int) -> Iterator[bytes]:
    chunk = bytes(_CHUNK)
    while size > 0:
        yield chunk[: min(size, _CHUNK)]
        size -= _CHUNK


@lru_cache(maxsize=4)
def _sha256_of_zeros(size: int) -> str:
    h = hashlib.sha256()
    for chunk in _zeros(size):
        h.update(chunk)
    return h.hexdigest()


def zero_filled_pack(manifest: KernelManifest, files: Mapping[str, bytes], name: str, size: int) -> bytes:
    """A *valid*, canonical pack of the kernel, except that file ``name`` is ``size`` zero bytes
    (its manifest entry says so truthfully): tiny compressed, huge unpacked. Streamed, never held
    whole; the frame declares its content size, as build_pack's does."""
    entries = [f.model_dump(mode="json") for f in manifest.files]
    for f in entries:
        if f["name"] == name:
            f["size"], f["sha256"] = size, _sha256_of_zeros(size)
    manifest_bytes = json.dumps(manifest.model_dump(mode="json") | {"files": entries}).encode()

    def parts() -> Iterator[bytes]:
        yield _member_header(MANIFEST_NAME, len(manifest_bytes)) + manifest_bytes + _pad(len(manifest_bytes))
        for f in entries:
            if f["name"] == name:
                yield _member_header(name, size)
                yield from _zeros(size)
                yield _pad(size)
            else:
                data = files[f["name"]]
                yield _member_header(f["name"], len(data)) + data + _pad(len(data))

    body = sum(len(p) for p in parts())
    total = body + 1024 + -(body + 1024) % 10240
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, size=total, closefd=False) as writer:
        for part in parts():
            writer.write(part)
        writer.write(bytes(total - body))
    return out.getvalue()


def pax_overflow_pack(manifest: KernelManifest, files: Mapping[str, bytes]) -> bytes:
    """The issue's input: a PAX record whose length field is 1000 digits, under the 1 KiB cap
    on extended headers; ``tarfile`` raises ``OverflowError`` on it."""
    records = b"1" * 1000 + b" path=x\n"
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    raw = io.BytesIO()
    raw.write(_member_header(MANIFEST_NAME, len(js := manifest.model_dump_json().encode())) + js + _pad(len(js)))
    raw.write(info.tobuf(tarfile.USTAR_FORMAT) + records + _pad(len(records)))
    for f in manifest.files:
        raw.write(_member_header(f.name, f.size) + files[f.name] + _pad(f.size))
    raw.write(bytes(1024))
    raw.write(bytes(-raw.tell() % 10240))
    return zstandard.ZstdCompressor(level=3).compress(raw.getvalue())


# ---- non-canonical packs: valid content, extra or unusual bytes -------------------------------


def _tar_of(pack: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(pack, max_output_size=1 << 28)


@lru_cache(maxsize=8)
def noncanonical_variants(pack: bytes) -> dict[str, bytes]:
    """Packs whose kernel files are exactly the real pack's, with bytes the format does not allow
    around them. The service stored such packs byte for byte before issue #17 (all but
    "garbage-after-frame", which its reader happened to refuse)."""
    tar = _tar_of(pack)
    cctx = zstandard.ZstdCompressor(level=3)
    junk = random.Random(17).randbytes(1 << 20)
    return {
        "second-zstd-frame": pack + cctx.compress(junk),
        "skippable-frame": pack + b"\x50\x2a\x4d\x18" + len(junk).to_bytes(4, "little") + junk,
        "garbage-after-frame": pack + b"\x00garbage" * 64,
        "corrupt-second-frame": pack + cctx.compress(junk)[:-100],
        "data-after-tar-end": cctx.compress(tar + junk[:20480]),
        "member-after-tar-end": cctx.compress(tar + _member_header("evil.so", 5) + b"\x7fELF." + _pad(5)),
        "two-frames-split-tar": cctx.compress(tar[:512]) + cctx.compress(tar[512:]),
        "tar-without-record-padding": cctx.compress(tar.rstrip(b"\0") + bytes(1024 + (-len(tar.rstrip(b"\0")) % 512))),
        "gnu-format-headers": cctx.compress(_retar(tar, tarfile.GNU_FORMAT)),
        "nonzero-mtime": cctx.compress(_retar(tar, tarfile.PAX_FORMAT, mtime=1_700_000_000)),
        "uname-set": cctx.compress(_retar(tar, tarfile.PAX_FORMAT, uname="mallory")),
        "pax-comment": cctx.compress(_retar(tar, tarfile.PAX_FORMAT, pax={"comment": "x" * 200})),
        "padding-not-zero": cctx.compress(_dirty_padding(tar)),
    }


def _retar(tar: bytes, fmt: int, pax: dict[str, str] | None = None, **attrs: object) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as src, tarfile.open(fileobj=out, mode="w|", format=fmt) as dst:
        for m in src.getmembers():
            fh = src.extractfile(m)
            for k, v in attrs.items():
                setattr(m, k, v)
            if pax:
                m.pax_headers = dict(pax)
            dst.addfile(m, fh)
    return out.getvalue()


def _dirty_padding(tar: bytes) -> bytes:
    """The first member's zero padding carries a byte of data."""
    size = int(tar[124:135], 8)
    end = 512 + size
    if end % 512 == 0:
        end += 1  # no padding to dirty: this corpus always has some
    b = bytearray(tar)
    b[end] = 0x41
    return bytes(b)


# ---- the mutation fuzzer ------------------------------------------------------------------------


Mutation = Callable[[random.Random, bytes], bytes]


def _flip_bits(rng: random.Random, pack: bytes) -> bytes:
    b = bytearray(pack)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _truncate(rng: random.Random, pack: bytes) -> bytes:
    return pack[: rng.randrange(len(pack))]


def _zstd_header_edit(rng: random.Random, pack: bytes) -> bytes:
    """Rewrite the frame header: window descriptor, frame-content-size, checksum flag."""
    b = bytearray(pack)
    i = rng.choice([4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    b[i] = rng.randrange(256)
    return bytes(b)


def _zstd_block_edit(rng: random.Random, pack: bytes) -> bytes:
    """Corrupt a block header or the last bytes (block contents, an optional checksum)."""
    b = bytearray(pack)
    where = rng.choice(["first-block", "tail"])
    i = 6 + rng.randrange(8) if where == "first-block" else len(b) - 1 - rng.randrange(min(16, len(b)))
    b[i] = rng.randrange(256)
    return bytes(b)


def _recompressed(mutate_tar: Callable[[random.Random, bytearray], None]) -> Mutation:
    def mutation(rng: random.Random, pack: bytes) -> bytes:
        tar = bytearray(_tar_of(pack))
        mutate_tar(rng, tar)
        return zstandard.ZstdCompressor(level=1).compress(bytes(tar))

    return mutation


def _header_offsets(tar: bytearray) -> list[int]:
    offsets, off = [], 0
    while off + 512 <= len(tar) and any(tar[off : off + 512]):
        offsets.append(off)
        try:
            size = int(tar[off + 124 : off + 135] or b"0", 8)
        except ValueError:
            break
        off += 512 + -(-size // 512) * 512
    return offsets


def _tar_header_field(rng: random.Random, tar: bytearray) -> None:
    """A random byte of one member header (name, mode, size, type, magic, checksum...)."""
    off = rng.choice(_header_offsets(tar) or [0])
    tar[off + rng.randrange(512)] = rng.randrange(256)


def _tar_huge_size(rng: random.Random, tar: bytearray) -> None:
    """A member declares a huge size: octal, base-256, or digits the field cannot hold."""
    off = rng.choice(_header_offsets(tar) or [0])
    tar[off + 124 : off + 136] = rng.choice(
        [b"77777777777\0", b"\x80" + b"\xff" * 11, b"\xff" * 12, b"99999999999\0", b"-0000000001\0"]
    )


def _tar_type(rng: random.Random, tar: bytearray) -> None:
    """A member becomes a link, device, dir, PAX/GNU extension or sparse file."""
    off = rng.choice(_header_offsets(tar) or [0])
    tar[off + 156 : off + 157] = rng.choice([b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"x", b"g", b"L", b"K", b"S", b"V", b"M", b"\xff"])


def _tar_pax_record(rng: random.Random, tar: bytearray) -> None:
    """Insert a PAX extended header with a hostile record before a member."""
    records = rng.choice(
        [
            b"1" * 1000 + b" path=x\n",
            b"99999999999999999999 path=x\n",
            b"0 path=x\n",
            b"12 size=-1\n",
            b"30 size=99999999999999999999\n",
            b"17 path=\xff\xfe\xfd\n",
            b"15 GNU.sparse.map=1,2\n",
            b"abc\n",
        ]
    )
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    block = info.tobuf(tarfile.USTAR_FORMAT) + records + _pad(len(records))
    off = rng.choice(_header_offsets(tar) or [0])
    tar[off:off] = block


def _tar_splice(rng: random.Random, tar: bytearray) -> None:
    """Cut or duplicate a run of 512-byte blocks."""
    n = len(tar) // 512
    i, j = sorted(rng.randrange(n) for _ in range(2))
    block = tar[i * 512 : (j + 1) * 512]
    if rng.random() < 0.5:
        del tar[i * 512 : (j + 1) * 512]
    else:
        tar[j * 512 : j * 512] = block


MUTATIONS: dict[str, Mutation] = {
    "bit-flips": _flip_bits,
    "truncation": _truncate,
    "zstd-frame-header": _zstd_header_edit,
    "zstd-block": _zstd_block_edit,
    "tar-header-byte": _recompressed(_tar_header_field),
    "tar-huge-size": _recompressed(_tar_huge_size),
    "tar-member-type": _recompressed(_tar_type),
    "tar-pax-record": _recompressed(_tar_pax_record),
    "tar-block-splice": _recompressed(_tar_splice),
}


def mutations(packs: list[bytes], count: int, seed: int) -> Iterator[tuple[str, int, bytes]]:
    """``count`` mutants of the given real packs, ``(mutation name, index of the pack it was made
    from, bytes)``, every mutation in turn; deterministic for a seed (zstandard's output is
    deterministic per level)."""
    rng = random.Random(seed)
    names = sorted(MUTATIONS)
    for i in range(count):
        name = names[i % len(names)]
        origin = rng.randrange(len(packs))
        yield name, origin, MUTATIONS[name](rng, packs[origin])


# ---- what older services stored -----------------------------------------------------------------


def store_as_older_service(data_dir: Path, namespace: str, key: str, pack: bytes) -> None:
    """Put a pack into a ``kcache serve`` data dir (file blobs + SQLite) as a service before #17
    stored it: blob and index record, none of today's checks (the manifest is read for the
    record). Safe while that server runs: a blob appears atomically, the record commits it."""
    from datetime import datetime, timezone

    from kcache_schemas import KernelEntry
    from kcache_server.storage import open_blob_store, open_index
    from kcache_server.storage.base import IndexRecord

    reader = zstandard.ZstdDecompressor().stream_reader(pack)
    header = reader.read(512)
    manifest = KernelManifest.model_validate_json(reader.read(int(header[124:135], 8)))
    entry = KernelEntry(
        namespace=namespace, key=key, kernel_name=manifest.kernel_name, target=manifest.target,
        triton_version=manifest.triton_version, files=manifest.files, total_size=manifest.total_size,
        pack_size=len(pack), content_digest=manifest.content_digest,
        created_at=datetime.now(timezone.utc), producer=manifest.producer,
    )
    digest = hashlib.sha256(pack).hexdigest()
    blobs = open_blob_store(f"file://{data_dir / 'blobs'}")
    index = open_index(f"sqlite://{data_dir / 'index.sqlite3'}")
    try:
        blobs.put(digest, pack)
        index.put_if_absent(IndexRecord(namespace, "kernel", key, digest, len(pack), entry.model_dump_json()))
    finally:
        blobs.close()
        index.close()
