"""The kernel pack: one Triton kernel dir as a single zstd-compressed, streamable file.

Format, version 1 (media type ``application/vnd.kcache.pack.v1``, file suffix ``.kpack``)::

    zstd( tar(PAX) [ kcache-pack.json, <file 1>, <file 2>, ... ] )

* The first tar member is ``kcache-pack.json``, a :class:`KernelManifest` (key, kernel name,
  target, triton version, and ``name``/``size``/``sha256`` of every file).
* Then every file of the kernel dir, in manifest order, as plain regular members. No dirs,
  links, devices or other member types; no member that the manifest does not name.
* ``.json`` payloads are stored exactly as ``TritonBundler.collect`` produces them: the kernel
  dir's absolute path replaced by ``[REPLACE]``. Nothing in a pack is machine-local.
* Members are written with mtime 0, uid/gid 0 and mode 0644, so the same files give the same bytes.

A reader can verify and write each file as it streams (manifest first), and standard tools can
inspect a pack: ``zstd -dc X.kpack | tar tv``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import zstandard
from pydantic import ValidationError

from kcache_schemas.error_codes import ErrorCode, PackError
from kcache_schemas.keys import InvalidKeyError, hex_to_kernel_key, normalize_kernel_key
from kcache_schemas.models import (
    GROUP_PREFIX,
    REPLACE_SENTINEL,
    KernelManifest,
    KernelTarget,
    PackFile,
    Producer,
)

MANIFEST_NAME = "kcache-pack.json"
MEDIA_TYPE = "application/vnd.kcache.pack.v1"
_REPLACE = REPLACE_SENTINEL.encode()
# tar headers, padding and the end-of-archive blocks: generous per-member allowance on top of
# the payload bytes when capping decompression.
_TAR_OVERHEAD_PER_MEMBER = 3 * 512


@dataclass(frozen=True)
class PackLimits:
    """Caps that make a hostile pack cheap to refuse (bombs, huge manifests, file floods).

    ``max_unpacked_bytes`` caps the files' total size (the service's ``KCACHE_MAX_UNPACKED_BYTES``);
    ``max_json_bytes`` caps each ``.json`` file, the only files a reader holds and parses while it
    verifies (Triton's metadata and group files are a few KB).
    """

    max_unpacked_bytes: int = 1 << 30
    max_manifest_bytes: int = 1 << 20
    max_files: int = 64
    max_json_bytes: int = 1 << 20

    @property
    def max_tar_bytes(self) -> int:
        """The most a pack within these limits decompresses to: files, manifest, tar headers."""
        return self.max_unpacked_bytes + self.max_manifest_bytes + _TAR_OVERHEAD_PER_MEMBER * (self.max_files + 2)


DEFAULT_LIMITS = PackLimits()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _target_from_metadata(meta: Mapping[str, object]) -> KernelTarget:
    target = meta.get("target")
    if not isinstance(target, dict):
        raise PackError("kernel metadata has no 'target' object")
    backend, arch, warp_size = target.get("backend"), target.get("arch"), target.get("warp_size")
    try:
        return KernelTarget(
            device_type=backend,  # type: ignore[arg-type]
            arch=str(arch) if isinstance(arch, (int, str)) else json.dumps(arch, sort_keys=True),
            warp_size=warp_size,  # type: ignore[arg-type]
        )
    except ValidationError as exc:
        raise PackError(f"kernel metadata 'target' is not usable: {target!r}") from exc


def check_kernel_files(manifest: KernelManifest, files: Mapping[str, bytes]) -> None:
    """Check that files and manifest agree and form a path-free Triton kernel dir.

    Raises :class:`PackError` naming the first problem. Run by the service before it stores a
    pack and by the client before it emits one, so both trust nothing they are sent.
    """
    if set(files) != {f.name for f in manifest.files}:
        raise PackError("files do not match the manifest's file list")
    parsed: dict[str, object] = {}  # each .json parsed once
    for f in manifest.files:
        data = files[f.name]
        if len(data) != f.size:
            raise PackError(f"{f.name}: size {len(data)} does not match manifest size {f.size}")
        if _sha256(data) != f.sha256:
            raise PackError(f"{f.name}: sha256 does not match the manifest")
        parsed[f.name] = _check_content(f.name, data, _REPLACE in data)
    _check_kernel_dir(manifest, parsed[manifest.metadata_file], parsed[manifest.group_file])


def _check_content(name: str, data: bytes, has_sentinel: bool) -> object:
    """A .json file's parsed value (it must parse); other files must not carry the sentinel."""
    if name.endswith(".json"):
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError; deep nesting
            raise PackError(f"{name}: not valid JSON ({str(exc)[:200]})") from None
    if has_sentinel:
        raise PackError(f"{name}: the {REPLACE_SENTINEL} sentinel may appear only in .json files")
    return None


def _names_kernel(name: object, stem: str) -> bool:
    """Whether metadata ``name`` belongs to files named ``stem``: the same, or cut short.

    Triton names a kernel's files after the first 150 characters of its name
    (``file_name = src.name[:150]``, triton/compiler/compiler.py) while ``<file>.json`` keeps the
    whole name; Inductor's fused kernels in training graphs are often longer. A prefix, not the
    150 itself: a Triton that cuts elsewhere still names its files by a prefix of the name."""
    return isinstance(name, str) and name.startswith(stem)


def _check_kernel_dir(manifest: KernelManifest, meta: object, group: object) -> None:
    """The metadata and group files (parsed) name this kernel and its files, path-free."""
    if not isinstance(meta, dict):
        raise PackError(f"{manifest.metadata_file}: not a JSON object")
    hex_hash = meta.get("hash")
    if not isinstance(hex_hash, str) or len(hex_hash) != 64:
        raise PackError(f"{manifest.metadata_file}: no 64-hex 'hash' field")
    try:
        derived_key = hex_to_kernel_key(hex_hash)
    except ValueError as exc:
        raise PackError(f"{manifest.metadata_file}: 'hash' is not hex") from exc
    if derived_key != manifest.key:
        raise PackError(
            f"pack is for kernel {derived_key} (from {manifest.metadata_file}), not {manifest.key}",
            ErrorCode.KEY_MISMATCH,
        )
    if not _names_kernel(meta.get("name"), manifest.kernel_name):
        raise PackError(f"{manifest.metadata_file}: 'name' is neither {manifest.kernel_name!r} nor a longer name it starts")
    if _target_from_metadata(meta) != manifest.target:
        raise PackError("manifest target does not match the kernel metadata's target")

    children = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(children, dict):
        raise PackError(f"{manifest.group_file}: no 'child_paths' object")
    expected = {f.name for f in manifest.files} - {manifest.group_file}
    if set(children) != expected:
        raise PackError(f"{manifest.group_file}: children {sorted(children)} != files {sorted(expected)}")
    for child, path in children.items():
        if path != f"{REPLACE_SENTINEL}/{child}":
            raise PackError(
                f"{manifest.group_file}: child {child!r} points to {str(path)[:120]!r}, "
                f"expected '{REPLACE_SENTINEL}/{child}' (path-free form)"
            )


def manifest_for_files(
    key: str, files: Mapping[str, bytes], producer: Producer | None = None
) -> KernelManifest:
    """Build and check the manifest for a kernel dir's files already in ``[REPLACE]`` form."""
    try:
        key = normalize_kernel_key(key)
    except InvalidKeyError as exc:
        raise PackError(str(exc), ErrorCode.INVALID_KEY) from exc
    groups = [n for n in files if n.startswith(GROUP_PREFIX)]
    if len(groups) != 1:
        raise PackError(f"a kernel dir has exactly one {GROUP_PREFIX}<name>.json file, found {groups}")
    kernel_name = groups[0][len(GROUP_PREFIX) : -len(".json")]
    meta_name = f"{kernel_name}.json"
    if meta_name not in files:
        raise PackError(f"kernel dir lacks its metadata file {meta_name!r}")
    try:
        meta = json.loads(files[meta_name])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackError(f"{meta_name}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise PackError(f"{meta_name}: not a JSON object")
    try:
        manifest = KernelManifest(
            key=key,
            kernel_name=kernel_name,
            target=_target_from_metadata(meta),
            triton_version=str(meta.get("triton_version") or "unknown"),
            files=[
                PackFile(name=n, size=len(d), sha256=_sha256(d)) for n, d in sorted(files.items())
            ],
            producer=producer or Producer(),
        )
    except ValidationError as exc:
        raise PackError(f"kernel dir does not form a valid manifest: {_first_error(exc)}") from exc
    check_kernel_files(manifest, files)
    return manifest


def build_pack(manifest: KernelManifest, files: Mapping[str, bytes], level: int = 3) -> bytes:
    """Serialise a checked manifest and its files into pack bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        _add_member(tf, MANIFEST_NAME, manifest.model_dump_json().encode())
        for f in manifest.files:
            _add_member(tf, f.name, files[f.name])
    return zstandard.ZstdCompressor(level=level).compress(raw.getvalue())


def _add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tf.addfile(info, io.BytesIO(data))


# ---- reading ---------------------------------------------------------------------------------
#
# The canonical form is what build_pack writes, and the only form the service stores:
#
# * exactly one zstd frame, declaring its content size, needing a window of at most
#   CANONICAL_MAX_WINDOW (what zstd levels 1-19 use), with nothing before or after it: no second
#   or skippable frame, no trailing bytes;
# * whose content is exactly the tar build_pack writes for the pack's manifest: the manifest
#   first, then the files in manifest order, each header byte for byte what tarfile writes for a
#   regular file with mode 0644, mtime 0, uid/gid 0 and no owner names (a PAX header, carrying
#   only "path", for names over 100 bytes), zero padding, and the end-of-archive blocks padded to
#   a whole 10 KiB record. Nothing else.
#
# Only the manifest's JSON is not compared byte for byte (schema versions may spell it
# differently); the schema judges it. The canonical reader compares bytes instead of parsing tar
# headers (no tar parser ever sees a hostile header) and streams: each file is hashed as it
# decompresses, and only .json files (KBs) are held, to be parsed.
#
# Packs that services stored before this form was enforced may differ in layout (a second frame,
# data after the tar, other tar writers); readers still read them through the lenient reader
# (tarfile in stream mode under the bomb guard, as before), but verify_pack, which the service
# runs on every upload, refuses them.

CANONICAL_MAX_WINDOW = 8 << 20
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOCK = 512
_RECORD = 20 * _BLOCK  # tarfile pads a closed archive to whole records of this size
_CHUNK = 1 << 20
# A pack whose tar is at most this big (nearly every real one: ~100 KB) is decompressed in one
# call; a bigger one streams _CHUNK at a time through a window of at most CANONICAL_MAX_WINDOW.
_ONE_SHOT_BYTES = 8 << 20


class _NotCanonical(PackError):
    """The bytes are not laid out as build_pack lays them out. The content may still be valid:
    readers fall back to the lenient reader, the service refuses the upload."""


def verify_pack(data: bytes, limits: PackLimits = DEFAULT_LIMITS) -> KernelManifest:
    """Check pack bytes for storing: canonical form and every check :func:`read_pack` makes.

    Streams: whatever the pack unpacks to, it holds at most :func:`pack_work_bytes` beyond
    ``data``. Every problem is a :class:`PackError` naming it; a layout problem says what
    build_pack would have written instead.
    """
    return _read_canonical(data, limits)[0]


def read_pack(
    data: bytes, limits: PackLimits = DEFAULT_LIMITS
) -> tuple[KernelManifest, dict[str, bytes]]:
    """Parse and fully verify pack bytes; every problem is a :class:`PackError`.

    Reads canonical packs and, through the lenient reader, packs that older services stored in
    another layout.
    """
    try:
        return _read_canonical(data, limits, keep_all=True)
    except _NotCanonical:
        pass  # another layout: the lenient reader judges it, as before canonical packs
    manifest, files = _read_lenient(data, limits)
    check_kernel_files(manifest, files)
    return manifest, files


def read_pack_file(
    data: bytes, name: str, limits: PackLimits = DEFAULT_LIMITS
) -> tuple[KernelManifest, bytes | None]:
    """The pack's manifest and file ``name`` (None when the manifest has no such file), its size
    and sha256 checked against the manifest. Files after it are not decompressed, files before
    it are decompressed but not held.
    """
    try:
        manifest, files = _read_canonical(data, limits, only=name)
    except _NotCanonical:
        manifest, files = _read_lenient(data, limits, only=name)
        if name in files:
            entry = next(f for f in manifest.files if f.name == name)
            if len(files[name]) != entry.size or _sha256(files[name]) != entry.sha256:
                raise PackError(f"{name}: size or sha256 does not match the manifest") from None
    return manifest, files.get(name)


def pack_work_bytes(data: bytes, limits: PackLimits = DEFAULT_LIMITS) -> int:
    """About the most memory reading these pack bytes holds beyond the bytes themselves (for
    admission control; at most 16 MiB): the tar when it is decompressed in one piece (and its
    .json files, parsed), else the zstd window, two chunks and the two .json files kept for the
    kernel-dir checks. A file that :func:`read_pack_file` returns is not included."""
    try:
        size = zstandard.frame_content_size(data)
        window = zstandard.get_frame_parameters(data).window_size
    except zstandard.ZstdError:
        return 0  # refused before anything is decompressed
    if size > limits.max_tar_bytes:
        return 0  # likewise
    if 0 <= size <= _ONE_SHOT_BYTES:
        return int(size) * 2  # the tar, and at most as much again in the .json files kept
    return int(window) + 2 * _CHUNK + 2 * limits.max_json_bytes


# ---- the canonical reader -------------------------------------------------------------------


class _MemoryTar:
    """The tar decompressed in one piece."""

    def __init__(self, raw: bytes) -> None:
        self._raw, self.pos = raw, 0

    def read(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self._raw):
            raise _NotCanonical("pack is truncated: its tar ends early")
        data, self.pos = self._raw[self.pos : end], end
        return data

    def chunks(self, n: int) -> Iterator[bytes]:
        yield self.read(n)

    def region(self, n: int) -> tuple[memoryview, bool]:
        """The next ``n`` bytes without a copy, and whether [REPLACE] occurs in them."""
        start, end = self.pos, self.pos + n
        if end > len(self._raw):
            raise _NotCanonical("pack is truncated: its tar ends early")
        self.pos = end
        return memoryview(self._raw)[start:end], self._raw.find(_REPLACE, start, end) >= 0

    def at_end(self) -> bool:
        return self.pos == len(self._raw)


class _StreamTar:
    """The tar decompressed as it is read, _CHUNK at a time."""

    def __init__(self, data: bytes) -> None:
        dctx = zstandard.ZstdDecompressor(max_window_size=CANONICAL_MAX_WINDOW)
        self._reader = dctx.stream_reader(data, read_size=1 << 17)
        self.pos = 0

    def _read_up_to(self, n: int) -> bytes:
        try:
            out = self._reader.read(n)
            while 0 < len(out) < n:
                more = self._reader.read(n - len(out))
                if not more:
                    break
                out += more
        except zstandard.ZstdError as exc:
            raise _NotCanonical(f"pack is truncated or corrupt (zstd: {exc})") from None
        self.pos += len(out)
        return bytes(out)

    def read(self, n: int) -> bytes:
        data = self._read_up_to(n)
        if len(data) < n:
            raise _NotCanonical("pack is truncated: its tar ends early")
        return data

    def chunks(self, n: int) -> Iterator[bytes]:
        while n > 0:
            step = min(n, _CHUNK)
            yield self.read(step)
            n -= step

    def at_end(self) -> bool:
        return self._read_up_to(1) == b""


def _open_canonical(data: bytes, limits: PackLimits) -> _MemoryTar | _StreamTar:
    """Check the zstd framing (before decompressing anything) and open the tar it holds."""
    if data[:4] != _ZSTD_MAGIC:
        if len(data) >= 8 and data[0] & 0xF0 == 0x50 and data[1:4] == b"\x2a\x4d\x18":
            raise _NotCanonical("pack starts with a skippable zstd frame; a pack is one zstd frame")
        raise _NotCanonical("pack is not zstd-compressed (no zstd magic number)")
    try:
        size = zstandard.frame_content_size(data)
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as exc:
        raise _NotCanonical(f"pack is truncated or corrupt: unreadable zstd frame header ({exc})") from None
    if size < 0:
        raise _NotCanonical("pack's zstd frame does not declare its content size (build_pack's does)")
    if size > limits.max_tar_bytes:
        raise PackError(
            f"pack decompresses to more than the allowed size ({size} > {limits.max_tar_bytes} bytes)",
            ErrorCode.TOO_LARGE,
        )
    if params.dict_id:
        raise _NotCanonical("pack's zstd frame needs a dictionary; packs are compressed without one")
    if params.window_size > CANONICAL_MAX_WINDOW:
        raise _NotCanonical(
            f"pack's zstd frame needs a {params.window_size >> 20} MiB window; packs use at most "
            f"{CANONICAL_MAX_WINDOW >> 20} MiB (zstd levels 1-19)"
        )
    end = _zstd_frame_end(data, size)
    if end > len(data):
        raise _NotCanonical("pack is truncated: its zstd frame ends early")
    if end < len(data):
        raise _NotCanonical(
            f"pack has {len(data) - end} bytes after its zstd frame (a second frame or trailing data)"
        )
    if size > _ONE_SHOT_BYTES:
        return _StreamTar(data)
    try:  # the declared size is checked by zstd and allocated once
        return _MemoryTar(zstandard.ZstdDecompressor().decompress(data))
    except zstandard.ZstdError as exc:
        raise _NotCanonical(f"pack is truncated or corrupt (zstd: {exc})") from None


def _zstd_frame_end(data: bytes, content_size: int) -> int:
    """Where the zstd frame that starts ``data`` ends, from its block headers (RFC 8878 §3.1.1),
    without decompressing. A compressor's blocks regenerate KBs each, so a frame of more blocks
    than its content size allows is refused before the walk could cost much."""
    fhd = data[4]
    single_segment = fhd >> 5 & 1
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[fhd & 3]
    pos += (single_segment, 2, 4, 8)[fhd >> 6]
    for _ in range(content_size // 256 + 16):
        if pos + 3 > len(data):
            return len(data) + 1
        header = int.from_bytes(data[pos : pos + 3], "little")
        block_type = header >> 1 & 3
        if block_type == 3:
            raise _NotCanonical("pack is corrupt: its zstd frame has a block of the reserved type")
        pos += 3 + (1 if block_type == 1 else header >> 3)  # RLE blocks carry one byte
        if header & 1:  # the last block
            return pos + (4 if fhd & 4 else 0)  # content checksum
    raise _NotCanonical("pack's zstd frame has more blocks than its content size allows")


def _read_canonical(
    data: bytes, limits: PackLimits, *, keep_all: bool = False, only: str | None = None
) -> tuple[KernelManifest, dict[str, bytes]]:
    """Walk a canonical pack, checking everything; return the files asked for: all of them
    (read_pack), none (verify_pack), or ``only`` one, stopping after it (read_pack_file)."""
    tar = _open_canonical(data, limits)
    manifest = _canonical_manifest(tar, limits)
    if only is not None and only not in {f.name for f in manifest.files}:
        return manifest, {}
    kept: dict[str, bytes] = {}
    parsed: dict[str, object] = {}
    for f in manifest.files:
        _expect_header(tar, f.name, f.size)
        if only is not None and f.name != only:
            for _chunk in tar.chunks(f.size):
                pass  # before the wanted file: decompressed, not held
        else:
            content, value = _verified_file(tar, f, keep_all or f.name == only)
            if keep_all or f.name == only:
                kept[f.name] = content
            if f.name in (manifest.metadata_file, manifest.group_file):
                parsed[f.name] = value
        _expect_zeros(tar, -f.size % _BLOCK, f"the padding after {f.name}")
        if f.name == only:
            return manifest, kept
    _check_kernel_dir(manifest, parsed[manifest.metadata_file], parsed[manifest.group_file])
    _expect_end(tar)
    return manifest, kept


def _canonical_manifest(tar: _MemoryTar | _StreamTar, limits: PackLimits) -> KernelManifest:
    header = tar.read(_BLOCK)
    size_field = header[124:136]
    size = int(size_field[:11], 8) if re.fullmatch(rb"[0-7]{11}\0", size_field) else -1
    if size < 0 or header not in (_canonical_header(MANIFEST_NAME, size), _canonical_header(MANIFEST_NAME, size, _OLD_DEVICE_FIELD)):
        raise _NotCanonical(_header_problem(header, MANIFEST_NAME, None))
    if size > limits.max_manifest_bytes:
        raise PackError("pack manifest is too large", ErrorCode.TOO_LARGE)
    manifest = _parse_manifest(tar.read(size), limits)
    _expect_zeros(tar, -size % _BLOCK, f"the padding after {MANIFEST_NAME}")
    return manifest


def _verified_file(tar: _MemoryTar | _StreamTar, f: PackFile, keep: bool) -> tuple[bytes, object]:
    """The file's bytes (``b""`` unless kept or .json) and, for a .json file, its parsed value;
    hashed as it decompresses."""
    is_json = f.name.endswith(".json")
    if isinstance(tar, _MemoryTar):  # one piece: no chunk bookkeeping, no copy unless kept
        if keep or is_json:
            content = tar.read(f.size)
            view, sentinel = memoryview(content), not is_json and _REPLACE in content
        else:
            content = b""
            view, sentinel = tar.region(f.size)
        if hashlib.sha256(view).hexdigest() != f.sha256:
            raise PackError(f"{f.name}: sha256 does not match the manifest")
        return content, _check_content(f.name, content, sentinel)
    digest = hashlib.sha256()
    keep = keep or is_json
    # BytesIO grows in place and hands its buffer over without a copy: a multi-chunk file is
    # held once, where a joined list of chunks was held twice.
    kept: bytes | io.BytesIO = b""
    sentinel = False
    tail = b""
    for chunk in tar.chunks(f.size):
        digest.update(chunk)
        if keep:
            if isinstance(kept, io.BytesIO):
                kept.write(chunk)
            elif kept:
                kept = io.BytesIO(kept)
                kept.seek(0, io.SEEK_END)
                kept.write(chunk)
            else:
                kept = chunk
        # across chunk boundaries too: the end of the last chunk with the start of this one
        sentinel = sentinel or _REPLACE in chunk or _REPLACE in tail + chunk[: len(_REPLACE) - 1]
        tail = chunk[-(len(_REPLACE) - 1) :]
    if digest.hexdigest() != f.sha256:
        raise PackError(f"{f.name}: sha256 does not match the manifest")
    content = kept.getvalue() if isinstance(kept, io.BytesIO) else kept
    return content, _check_content(f.name, content, sentinel)


def _expect_header(tar: _MemoryTar | _StreamTar, name: str, size: int) -> None:
    expected = _canonical_header(name, size)
    got = tar.read(len(expected))
    if got != expected and got != _canonical_header(name, size, _OLD_DEVICE_FIELD):
        raise _NotCanonical(_header_problem(got, name, size))


def _expect_zeros(tar: _MemoryTar | _StreamTar, n: int, what: str) -> None:
    if n and tar.read(n).count(0) != n:
        raise _NotCanonical(f"pack has data in {what} (tar padding is zeros)")


def _expect_end(tar: _MemoryTar | _StreamTar) -> None:
    """The end-of-archive blocks, padded to a whole record, then the end of the content."""
    trailer = tar.read(2 * _BLOCK + -(tar.pos + 2 * _BLOCK) % _RECORD)
    if trailer[:_BLOCK].count(0) != _BLOCK:
        raise _NotCanonical(_header_problem(trailer, None, None))
    if trailer.count(0) != len(trailer) or not tar.at_end():
        raise _NotCanonical("pack has data after its tar's end-of-archive blocks")


# The device-number fields of a regular file's header as tarfile writes them: NULs (Python
# >= 3.9), or octal zeros (3.8, the spelling also accepted).
_DEVICE_FIELD, _OLD_DEVICE_FIELD = bytes(8), b"0000000\0"


def _canonical_header(name: str, size: int, dev: bytes = _DEVICE_FIELD) -> bytes:
    """The header bytes build_pack writes for a member."""
    raw = name.encode("ascii", "surrogateescape")
    header = b""
    if len(raw) > 100:  # tarfile's PAX_FORMAT: the full name in a "path" record
        records = _pax_record(b"path", raw)
        header = _ustar_block(b"././@PaxHeader", len(records), tarfile.XHDTYPE, 0, dev)
        header += records + bytes(-len(records) % _BLOCK)
    return header + _ustar_block(raw, size, tarfile.REGTYPE, 0o644, dev)


def _canonical_headers(name: str, size: int) -> tuple[bytes, bytes]:
    """Both spellings (for tests and messages)."""
    return _canonical_header(name, size), _canonical_header(name, size, _OLD_DEVICE_FIELD)


@functools.lru_cache(maxsize=8)
def _ustar_tail(typeflag: bytes, dev: bytes) -> tuple[bytes, int]:
    """Everything after the checksum field (typeflag, linkname, magic, owner names, device
    numbers, prefix, padding) and its byte sum."""
    tail = typeflag + bytes(100) + tarfile.POSIX_MAGIC + bytes(64) + dev * 2 + bytes(155 + 12)
    return tail, sum(tail)


def _ustar_block(name: bytes, size: int, typeflag: bytes, mode: int, dev: bytes) -> bytes:
    """A ustar header block as tarfile's ``_create_header`` writes it (uid/gid/mtime 0): the
    checksum counts its own field as eight spaces."""
    head = name[:100].ljust(100, b"\0") + b"%07o\0" % mode + b"0000000\0" * 2 + b"%011o\0" % size + b"00000000000\0"
    tail, tail_sum = _ustar_tail(typeflag, dev)
    return head + b"%06o\0 " % (sum(head) + 8 * 32 + tail_sum) + tail


def _pax_record(keyword: bytes, value: bytes) -> bytes:
    """One PAX record, ``"<length> <keyword>=<value>\\n"``, whose length counts its own digits
    (tarfile's ``_create_pax_generic_header`` loop)."""
    body = len(keyword) + len(value) + 3  # " ", "=", "\n"
    length = prev = 0
    while True:
        length = body + len(str(prev))
        if length == prev:
            break
        prev = length
    return b"%d %s=%s\n" % (length, keyword, value)


def _header_problem(got: bytes, name: str | None, size: int | None) -> str:
    """What is wrong with header bytes that are not the expected ones, in words."""
    block = got[:_BLOCK]
    if not any(block):
        return f"pack is truncated: {name} is missing" if name else "pack is truncated"
    found = block[:100].split(b"\0", 1)[0].decode("ascii", "replace")
    typeflag = block[156:157]
    if typeflag in _EXTENDED_TYPES and (name is None or len(name) <= 100):
        return f"pack has an extended tar header (type {typeflag.decode('latin-1')!r}); packs have none"
    if name == MANIFEST_NAME and (found != MANIFEST_NAME or typeflag not in (tarfile.REGTYPE, tarfile.AREGTYPE)):
        return f"the first pack member must be the regular file {MANIFEST_NAME}"
    if name is None:
        return f"pack member {found[:120]!r} is not named by the manifest"
    if typeflag not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        kind = {tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hard link", tarfile.GNUTYPE_SPARSE: "sparse"}.get(typeflag, "non-regular")
        return f"pack member {found[:120]!r} is a {kind} entry; only files are allowed"
    if found != name[:100]:
        return f"pack member {found[:120]!r} is not {name!r} (manifest order)"
    if size is not None and block[124:136] != b"%011o\0" % size:
        return f"{name}: tar size {block[124:136].rstrip(bytes(1))!r} != manifest size {size}"
    return (
        f"the tar header of {name!r} is not the one build_pack writes (ustar/PAX, mode 0644, "
        "mtime 0, uid/gid 0, no owner names)"
    )


# ---- the lenient reader: any tar layout of a valid pack ---------------------------------------

# tarfile parses PAX records and reads GNU long names before a member reaches our checks, and
# CPython < 3.11.10 / 3.12.6 parses PAX records in super-linear time (CVE-2024-6232): a few hundred
# KB of digits in one header pins a CPU for minutes. build_pack writes at most one short "path"
# record per member, so bigger extended headers are refused before tarfile parses them.
_MAX_EXTENDED_HEADER = 1024
_EXTENDED_TYPES = (
    tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK,
)


class _GuardedTarInfo(tarfile.TarInfo):
    def _proc_member(self, tarfile):  # type: ignore[no-untyped-def]
        if self.type in _EXTENDED_TYPES and self.size > _MAX_EXTENDED_HEADER:
            raise PackError(
                f"pack has a {self.size}-byte extended tar header (limit {_MAX_EXTENDED_HEADER})"
            )
        return super()._proc_member(tarfile)  # type: ignore[misc]


class _CappedReader(io.RawIOBase):
    """Reads a decompressing stream but refuses to yield more than ``cap`` bytes (bomb guard)."""

    def __init__(self, inner: IO[bytes], cap: int) -> None:
        self._inner, self._left = inner, cap

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        want = len(buf)
        data = self._inner.read(min(want, self._left + 1))
        if len(data) > self._left:
            raise PackError("pack decompresses to more than the allowed size", ErrorCode.TOO_LARGE)
        self._left -= len(data)
        buf[: len(data)] = data
        return len(data)


def _read_lenient(
    data: bytes, limits: PackLimits, only: str | None = None
) -> tuple[KernelManifest, dict[str, bytes]]:
    """Members as tarfile reads them, across zstd frames; the caller runs the file checks."""
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    reader = io.BufferedReader(_CappedReader(stream, limits.max_tar_bytes), buffer_size=1 << 16)
    try:
        with tarfile.open(fileobj=reader, mode="r|", tarinfo=_GuardedTarInfo) as tf:
            return _read_members(iter(tf), functools.partial(_read_member, tf), limits, only)
    except (PackError, MemoryError):
        raise
    except Exception as exc:
        # Whatever tarfile or zstandard raise on these bytes (TarError, ZstdError, EOFError,
        # and on hostile headers OverflowError, ValueError, UnicodeError...) is a bad pack.
        raise PackError(f"pack is truncated or not a zstd-compressed tar: {type(exc).__name__}: {exc}") from exc


def _read_members(
    members: Iterator[tarfile.TarInfo], read: Callable[[tarfile.TarInfo], bytes], limits: PackLimits,
    only: str | None = None,
) -> tuple[KernelManifest, dict[str, bytes]]:
    first = next(members, None)
    if first is None or first.name != MANIFEST_NAME or not first.isreg():
        raise PackError(f"the first pack member must be the regular file {MANIFEST_NAME}")
    if first.size > limits.max_manifest_bytes:
        raise PackError("pack manifest is too large", ErrorCode.TOO_LARGE)
    manifest = _parse_manifest(read(first), limits)
    files: dict[str, bytes] = {}
    for expected in manifest.files:
        member = next(members, None)
        if member is None:
            raise PackError(f"pack is truncated: {expected.name} is missing")
        if not member.isreg():
            kind = "symlink" if member.issym() else "hard link" if member.islnk() else "non-regular"
            raise PackError(f"pack member {member.name!r} is a {kind} entry; only files are allowed")
        if member.name != expected.name:
            raise PackError(f"pack member {member.name[:120]!r} is not {expected.name!r} (manifest order)")
        if member.size != expected.size:
            raise PackError(f"{member.name}: tar size {member.size} != manifest size {expected.size}")
        if only is None or member.name == only:
            files[member.name] = read(member)
            if member.name == only:
                return manifest, files
    if only is not None:
        return manifest, files
    extra = next(members, None)
    if extra is not None:
        raise PackError(f"pack member {extra.name[:120]!r} is not named by the manifest")
    return manifest, files


def _read_member(tf: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    fh = tf.extractfile(member)
    if fh is None:
        raise PackError(f"pack member {member.name!r} has no data")
    data = fh.read()
    if len(data) != member.size:
        raise PackError(f"pack is truncated inside {member.name!r}")
    return data


# ---- shared by both readers -------------------------------------------------------------------


def _parse_manifest(data: bytes, limits: PackLimits) -> KernelManifest:
    try:
        manifest = KernelManifest.model_validate_json(data)
    except ValidationError as exc:
        raise PackError(f"invalid pack manifest: {_first_error(exc)}") from exc
    if len(manifest.files) > limits.max_files:
        raise PackError(f"pack has {len(manifest.files)} files, limit {limits.max_files}")
    if manifest.total_size > limits.max_unpacked_bytes:
        raise PackError(
            f"pack unpacks to {manifest.total_size} bytes, limit {limits.max_unpacked_bytes}",
            ErrorCode.TOO_LARGE,
        )
    for f in manifest.files:
        if f.name.endswith(".json") and f.size > limits.max_json_bytes:
            raise PackError(
                f"{f.name}: {f.size} bytes of JSON, limit {limits.max_json_bytes}", ErrorCode.TOO_LARGE
            )
    return manifest


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))


def read_kernel_dir(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """Read a local Triton kernel dir into ``[REPLACE]`` form, as ``TritonBundler.collect`` does.

    The absolute dir prefix is taken from the group file's child paths (what Triton actually
    wrote), so a dir reached through a different spelling of its path still packs path-free.
    """
    root = Path(path)
    files: dict[str, bytes] = {}
    for entry in sorted(root.iterdir()):
        # Triton's own temp dirs and lock files are not part of a kernel.
        if entry.name.startswith("tmp.") or entry.name == "lock" or not entry.is_file():
            continue
        if entry.is_symlink():
            raise PackError(f"{entry.name}: symlinks are not packed")
        files[entry.name] = entry.read_bytes()
    prefixes = {str(root).encode(), os.path.abspath(root).encode()}
    for name, data in files.items():
        if name.startswith(GROUP_PREFIX) and name.endswith(".json"):
            try:
                group = json.loads(data)
                for child, child_path in group.get("child_paths", {}).items():
                    if isinstance(child_path, str) and child_path.endswith("/" + child):
                        prefixes.add(child_path[: -len(child) - 1].encode())
            except (ValueError, AttributeError):
                pass  # check_kernel_files reports the unusable group file
    for name, data in files.items():
        if name.endswith(".json"):
            if _REPLACE in data:
                raise PackError(f"{name}: already contains {REPLACE_SENTINEL}; refusing to pack")
            for prefix in sorted(prefixes, key=len, reverse=True):
                data = data.replace(prefix, _REPLACE)
            files[name] = data
    return files


def pack_kernel_dir(
    path: str | os.PathLike[str], producer: Producer | None = None, level: int = 3
) -> tuple[KernelManifest, bytes]:
    """Pack a local Triton kernel dir (named by its key) into checked pack bytes."""
    files = read_kernel_dir(path)
    manifest = manifest_for_files(Path(path).name, files, producer)
    return manifest, build_pack(manifest, files, level)


def substitute_dir(files: Mapping[str, bytes], final_dir: str) -> dict[str, bytes]:
    """``[REPLACE]`` → the kernel dir's real path in ``.json`` files, as ``read_and_emit`` does."""
    real = final_dir.encode()
    return {n: d.replace(_REPLACE, real) if n.endswith(".json") else d for n, d in files.items()}
