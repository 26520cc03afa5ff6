"""Hostile and broken uploads: each is refused with a 4xx JSON error, and nothing is stored.

Hostile packs are forged by hand with tarfile + zstandard (``api_helpers.forge_pack``), since the
pack builder refuses to make them.
"""

from __future__ import annotations

import io
import json
import tarfile
import time

import httpx
import pytest
import zstandard
from kcache_schemas import PackError, read_pack
from kcache_schemas.pack import MANIFEST_NAME, MEDIA_TYPE

from kcache_testkit.kernels import Kernel
from kcache_testkit.pace import bound

pytest.register_assert_rewrite("api_helpers")

from api_helpers import (  # noqa: E402
    LIMITS,
    assert_error,
    assert_nothing_stored,
    file_entry,
    forge_pack,
    manifest_dict,
    member,
    raw_pack,
)

from kcache_testkit.hostile_packs import (  # noqa: E402
    noncanonical_variants,
    pax_overflow_pack,
    store_as_older_service,
    zero_filled_pack,
)

pytest_plugins = ["api_helpers"]

# What the refusal of each non-canonical variant (hostile_packs.noncanonical_variants) names.
NONCANONICAL: dict[str, tuple[str, ...]] = {
    "second-zstd-frame": ("after its zstd frame",),
    "skippable-frame": ("after its zstd frame",),
    "garbage-after-frame": ("after its zstd frame",),
    "corrupt-second-frame": ("after its zstd frame",),
    "data-after-tar-end": ("after its tar's end-of-archive",),
    "member-after-tar-end": ("after its tar's end-of-archive",),
    "two-frames-split-tar": ("after its zstd frame",),
    "tar-without-record-padding": ("truncated",),
    "gnu-format-headers": ("tar header", "build_pack"),
    "nonzero-mtime": ("tar header", "mtime 0"),
    "uname-set": ("tar header", "no owner names"),
    "pax-comment": ("extended tar header",),
    "padding-not-zero": ("padding",),
}


def _put(client: httpx.Client, ns: str, key: str, body: bytes) -> httpx.Response:
    return client.put(f"/v1/{ns}/kernels/{key}", content=body, headers={"Content-Type": MEDIA_TYPE})


def _refused(
    client: httpx.Client, ns: str, k: Kernel, body: bytes, status: int, code: str, *fragments: str
) -> None:
    assert_error(_put(client, ns, k.key, body), status, code, *fragments)
    assert_nothing_stored(client, ns, k.key)


def _members(k: Kernel, files: dict[str, bytes] | None = None) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    files = files if files is not None else k.files
    return [member(MANIFEST_NAME, k.manifest.model_dump_json().encode())] + [
        member(n, files[n]) for n in (f.name for f in k.manifest.files)
    ]


def test_forged_pack_of_the_real_files_is_accepted(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """The forging helpers themselves make valid packs, so refusals below are about the flaw."""
    files = {f.name: kernel.files[f.name] for f in kernel.manifest.files}
    pack = forge_pack(manifest_dict(kernel, files), files)
    assert read_pack(pack)[1] == kernel.files
    assert _put(client, ns, kernel.key, pack).status_code == 201


# ---- keys and namespaces ---------------------------------------------------------------------


def _noncanonical(key: str) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return key[:-1] + alphabet[alphabet.index(key[-1]) ^ 1]


@pytest.mark.parametrize(
    "make_key",
    [
        lambda k: "not-a-key",
        lambda k: k.key[:-1],
        lambda k: k.key + "A",
        lambda k: k.key.lower(),
        lambda k: _noncanonical(k.key),
        lambda k: k.hex_key[:-1],
        lambda k: k.hex_key[:-1] + "g",
        lambda k: ".." + k.key[2:],
    ],
    ids=["junk", "short", "long", "lowercase", "noncanonical", "hex-short", "hex-nonhex", "dotdot"],
)
def test_malformed_kernel_key(client: httpx.Client, ns: str, kernel: Kernel, make_key) -> None:  # type: ignore[no-untyped-def]
    bad = make_key(kernel)
    err = assert_error(_put(client, ns, bad, kernel.pack), 400, "invalid_key", "kernel key")
    assert "52-char" in err["message"] or "canonical" in err["message"]
    assert_error(client.get(f"/v1/{ns}/kernels/{bad}"), 400, "invalid_key", "kernel key")
    assert_nothing_stored(client, ns, kernel.key)


@pytest.mark.parametrize("bad_ns", ["Team-A", "-x", "a_b!", "x" * 64])
def test_malformed_namespace(client: httpx.Client, kernel: Kernel, bad_ns: str) -> None:
    assert_error(_put(client, bad_ns, kernel.key, kernel.pack), 400, "invalid_key", "namespace")
    assert_error(client.get(f"/v1/{bad_ns}/kernels"), 400, "invalid_key", "namespace")


@pytest.mark.parametrize("bad_key", [".hidden", ":x", "a b"])
def test_malformed_entry_key(client: httpx.Client, ns: str, bad_key: str) -> None:
    url = f"/v1/{ns}/entries/fx-graph/{bad_key}"
    assert_error(client.put(url, content=b"x"), 400, "invalid_key", "entry key")
    assert_error(client.get(url), 400, "invalid_key", "entry key")


def test_malformed_layer(client: httpx.Client, ns: str) -> None:
    url = f"/v1/{ns}/entries/FX_graph/k1"
    assert_error(client.put(url, content=b"x"), 400, "invalid_key", "layer")


# ---- file names ----------------------------------------------------------------------------------

_BAD_NAMES = {
    "slash": "sub/evil.ptx",
    "dotdot": "../evil.ptx",
    "nul": "evil\x00.ptx",
    "leading-dot": ".evil",
    "dunder": "__evil",
    "dunder-not-group": "__grp__evil.ptx",
    "absolute": "/etc/passwd",
}


@pytest.mark.parametrize("bad", list(_BAD_NAMES.values()), ids=list(_BAD_NAMES))
def test_bad_file_name_in_manifest(client: httpx.Client, ns: str, kernel: Kernel, bad: str) -> None:
    files = dict(kernel.files)
    files[bad] = b"payload\n"
    pack = forge_pack(manifest_dict(kernel, files), files)
    _refused(client, ns, kernel, pack, 400, "invalid_pack", "manifest", "file name")


@pytest.mark.parametrize("bad", list(_BAD_NAMES.values()), ids=list(_BAD_NAMES))
def test_bad_member_name_in_tar(client: httpx.Client, ns: str, kernel: Kernel, bad: str) -> None:
    """The manifest is clean but the tar member carrying the .ptx is named to escape the dir."""
    members = _members(kernel)
    ptx = next(i for i, (info, _) in enumerate(members) if info.name.endswith(".ptx"))
    members[ptx] = member(bad, members[ptx][1])
    _refused(client, ns, kernel, raw_pack(members), 400, "invalid_pack", "pack member", "manifest order")


def test_duplicate_names_in_manifest(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    ptx = f"{kernel.name}.ptx"
    manifest = manifest_dict(kernel, kernel.files)
    manifest["files"].append(file_entry(ptx, kernel.files[ptx]))
    members = [member(MANIFEST_NAME, json.dumps(manifest).encode())]
    members += [member(f["name"], kernel.files[f["name"]]) for f in manifest["files"]]
    _refused(client, ns, kernel, raw_pack(members), 400, "invalid_pack", "duplicate", ptx)


def test_duplicate_member_in_tar(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """A second member with a name already seen (tar extraction would let it overwrite the first)."""
    members = _members(kernel)
    ptx = next(m for m in members if m[0].name.endswith(".ptx"))
    members.insert(members.index(ptx) + 1, member(ptx[0].name, b"// evil twin\n"))
    _refused(client, ns, kernel, raw_pack(members), 400, "invalid_pack", "pack member")


# ---- member types ----------------------------------------------------------------------------

_LINK_TYPES = {
    "symlink": ({"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, "symlink"),
    "hardlink": ({"type": tarfile.LNKTYPE, "linkname": "etc/passwd"}, "hard link"),
    "chardev": ({"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, "non-regular"),
    "blockdev": ({"type": tarfile.BLKTYPE, "devmajor": 8, "devminor": 0}, "non-regular"),
    "fifo": ({"type": tarfile.FIFOTYPE}, "non-regular"),
    "dir": ({"type": tarfile.DIRTYPE}, "non-regular"),
}


@pytest.mark.parametrize("kind", list(_LINK_TYPES))
def test_non_regular_member(client: httpx.Client, ns: str, kernel: Kernel, kind: str) -> None:
    attrs, word = _LINK_TYPES[kind]
    members = _members(kernel)
    i = next(i for i, (info, _) in enumerate(members) if info.name.endswith(".ptx"))
    members[i] = member(members[i][0].name, None, **attrs)
    _refused(client, ns, kernel, raw_pack(members), 400, "invalid_pack", word, "only files")


def test_manifest_not_first(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    members = _members(kernel)
    members = members[1:2] + members[:1] + members[2:]
    _refused(client, ns, kernel, raw_pack(members), 400, "invalid_pack", MANIFEST_NAME, "first")


def test_extra_member(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    members = [*_members(kernel), member("payload.so", b"\x7fELF...")]
    _refused(client, ns, kernel, raw_pack(members), 400, "invalid_pack", "payload.so", "not named")


def test_missing_member(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    members = _members(kernel)[:-1]
    _refused(client, ns, kernel, raw_pack(members), 400, "invalid_pack", "missing")


# ---- sizes and digests ---------------------------------------------------------------------------


def test_size_mismatch(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    ptx = f"{kernel.name}.ptx"
    manifest = manifest_dict(kernel, kernel.files)
    for f in manifest["files"]:
        if f["name"] == ptx:
            f["size"] += 1
    _refused(client, ns, kernel, forge_pack(manifest, kernel.files), 400, "invalid_pack", ptx, "size")


def test_sha256_mismatch(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    ptx = f"{kernel.name}.ptx"
    files = dict(kernel.files)
    manifest = manifest_dict(kernel, files)
    # Same size, one flipped byte: only the digest can tell.
    data = bytearray(files[ptx])
    data[len(data) // 2] ^= 0x01
    files[ptx] = bytes(data)
    _refused(client, ns, kernel, forge_pack(manifest, files), 400, "invalid_pack", ptx, "sha256")


@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.99])
def test_truncated_pack(client: httpx.Client, ns: str, kernel: Kernel, fraction: float) -> None:
    body = kernel.pack[: int(len(kernel.pack) * fraction)]
    _refused(client, ns, kernel, body, 400, "invalid_pack", "truncated")


@pytest.mark.parametrize("body", [b"", b"hello, world", b"\x28\xb5\x2f\xfd" + b"\x00" * 20])
def test_not_a_pack(client: httpx.Client, ns: str, kernel: Kernel, body: bytes) -> None:
    _refused(client, ns, kernel, body, 400, "invalid_pack", "pack")


def test_oversized_body(limited_client: httpx.Client, ns: str, kernel: Kernel) -> None:
    body = kernel.pack + b"\x00" * (LIMITS["max_pack_bytes"] + 1 - len(kernel.pack))
    _refused(limited_client, ns, kernel, body, 413, "too_large", "limit", str(LIMITS["max_pack_bytes"]))


def test_oversized_chunked_body(limited_client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """No Content-Length to trust: the server counts while it reads."""

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(LIMITS["max_pack_bytes"] // 4096 + 2):
            yield b"\x00" * 4096

    resp = limited_client.put(f"/v1/{ns}/kernels/{kernel.key}", content=chunks())
    assert_error(resp, 413, "too_large", "limit")
    assert_nothing_stored(limited_client, ns, kernel.key)


def test_limited_server_still_takes_real_packs(limited_client: httpx.Client, ns: str, kernel: Kernel) -> None:
    assert _put(limited_client, ns, kernel.key, kernel.pack).status_code == 201


def _gnu_sparse_header(name: str, size: int, ext_blocks: int, terminated: bool = True) -> bytes:
    """A GNU sparse ('S') member header followed by ``ext_blocks`` empty sparse-map extension blocks.

    tarfile reads extension blocks until one says "no more", before the member reaches any check;
    a long chain of identical blocks compresses to almost nothing."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    hdr = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    hdr[156:157] = tarfile.GNUTYPE_SPARSE
    hdr[483:495] = b"%011o\0" % size  # realsize
    hdr[482] = 1 if ext_blocks else 0  # isextended
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    more = bytearray(512)
    more[504] = 1
    blocks = bytes(more) * (ext_blocks - 1 if terminated else ext_blocks)
    return bytes(hdr) + blocks + (bytes(512) if terminated and ext_blocks else b"")


def _sparse_pack(k: Kernel, ext_blocks: int, terminated: bool = True) -> bytes:
    """The kernel's real pack, but its .ptx member is a GNU sparse member with a long map chain."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for info, data in _members(k):
            if info.name.endswith(".ptx"):
                assert data is not None
                tf.fileobj.write(_gnu_sparse_header(info.name, len(data), ext_blocks, terminated))
                if not terminated:
                    break
                tf.fileobj.write(data + bytes(-len(data) % 512))
            else:
                tf.addfile(info, io.BytesIO(data or b""))
    # (level 3 happens to compress this chain poorly after the kernel files; 1 does not)
    return zstandard.ZstdCompressor(level=1).compress(raw.getvalue())


def test_decompression_bomb(limited_client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """Every declared size is small, but a sparse-map chain decompresses to 8 MiB of tar headers
    (4x the cap the limits allow: 1 MiB of files + 1 MiB of manifest + header overhead)."""
    pack = _sparse_pack(kernel, ext_blocks=(8 << 20) // 512)
    assert len(pack) < LIMITS["max_pack_bytes"]
    _refused(limited_client, ns, kernel, pack, 413, "too_large", "decompresses to more than")


def test_truncated_sparse_chain_is_a_400_not_a_500(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """The service refuses any sparse member (packs hold plain files); a reader of packs that older
    services stored (tarfile's path) reports the truncated chain."""
    pack = _sparse_pack(kernel, 3, terminated=False)
    _refused(client, ns, kernel, pack, 400, "invalid_pack", "sparse", "only files")
    with pytest.raises(PackError, match="truncated"):
        read_pack(pack)


@pytest.mark.parametrize("where", ["pax", "global-pax", "gnu-longname"])
def test_huge_extended_header_is_refused_fast(client: httpx.Client, ns: str, kernel: Kernel, where: str) -> None:
    """tarfile's PAX parsing is super-linear on older CPythons (CVE-2024-6232): 256 KB of digits
    in one header would pin a server CPU for many minutes. Refused before tarfile parses it."""
    members = _members(kernel)
    padding = "7" * (256 << 10)
    if where == "pax":
        members[2][0].pax_headers = {"kcache.padding": padding}
    elif where == "global-pax":
        pack = raw_pack(members, global_pax={"comment": padding})
    else:
        members.insert(2, member("././@LongLink", padding.encode(), type=tarfile.GNUTYPE_LONGNAME))
    if where != "global-pax":
        pack = raw_pack(members)
    start = time.monotonic()
    _refused(client, ns, kernel, pack, 400, "invalid_pack", "extended tar header")
    assert time.monotonic() - start < bound(0, 20_000)  # ~10 s idle: no super-linear parse


def test_manifest_declares_too_much(limited_client: httpx.Client, ns: str, kernel: Kernel) -> None:
    ptx = f"{kernel.name}.ptx"
    files = dict(kernel.files)
    files[ptx] += b"// padding\n" * ((LIMITS["max_unpacked_bytes"] // 11) + 1)
    pack = forge_pack(manifest_dict(kernel, files), files)
    assert len(pack) < LIMITS["max_pack_bytes"]
    assert read_pack(pack)[1] == files  # valid under the default limits
    _refused(limited_client, ns, kernel, pack, 413, "too_large", "unpacks to", str(LIMITS["max_unpacked_bytes"]))


# ---- content checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["metadata", "group"])
def test_json_that_is_not_json(client: httpx.Client, ns: str, kernel: Kernel, which: str) -> None:
    name = f"{kernel.name}.json" if which == "metadata" else f"__grp__{kernel.name}.json"
    files = dict(kernel.files)
    files[name] = b'{"hash": "abc", not json'
    _refused(client, ns, kernel, forge_pack(manifest_dict(kernel, files), files), 400, "invalid_pack", name, "not valid JSON")


@pytest.mark.parametrize("suffix", ["ptx", "cubin", "llir"])
def test_replace_sentinel_outside_json(client: httpx.Client, ns: str, kernel: Kernel, suffix: str) -> None:
    name = f"{kernel.name}.{suffix}"
    files = dict(kernel.files)
    files[name] += b"\n[REPLACE]/../../etc/passwd\n"
    _refused(client, ns, kernel, forge_pack(manifest_dict(kernel, files), files), 400, "invalid_pack", name, "[REPLACE]")


def test_pack_for_another_key(client: httpx.Client, ns: str, kernels: list[Kernel]) -> None:
    a, b = kernels[0], kernels[1]
    resp = _put(client, ns, b.key, a.pack)
    assert_error(resp, 400, "key_mismatch", a.key, b.key)
    assert_nothing_stored(client, ns, a.key, b.key)


def test_manifest_key_disagrees_with_metadata_hash(client: httpx.Client, ns: str, kernels: list[Kernel]) -> None:
    """The manifest claims key B, but <name>.json (what Triton reads) is kernel A's."""
    a, b = kernels[0], kernels[1]
    manifest = manifest_dict(a, a.files, key=b.key)
    resp = _put(client, ns, b.key, forge_pack(manifest, a.files))
    assert_error(resp, 400, "key_mismatch", a.key, b.key)
    assert_nothing_stored(client, ns, a.key, b.key)


@pytest.mark.parametrize("path", ["/etc/passwd", "[REPLACE]/../../../etc/passwd", "/tmp/x/{child}"])
def test_group_file_child_path_not_path_free(client: httpx.Client, ns: str, kernel: Kernel, path: str) -> None:
    grp = f"__grp__{kernel.name}.json"
    ptx = f"{kernel.name}.ptx"
    files = dict(kernel.files)
    group = json.loads(files[grp])
    group["child_paths"][ptx] = path.format(child=ptx)
    files[grp] = json.dumps(group).encode()
    _refused(client, ns, kernel, forge_pack(manifest_dict(kernel, files), files), 400, "invalid_pack", grp, "path-free")


def test_metadata_target_disagrees_with_manifest(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """A manifest claiming sm_80 for an sm_90 kernel would defeat the client's arch check."""
    manifest = manifest_dict(kernel, kernel.files, target={"device_type": "cuda", "arch": "80", "warp_size": 32})
    _refused(client, ns, kernel, forge_pack(manifest, kernel.files), 400, "invalid_pack", "target")


def test_entry_too_large(tmp_path, ns: str) -> None:  # type: ignore[no-untyped-def]
    from api_helpers import inproc_client, make_settings

    with inproc_client(make_settings(tmp_path, max_entry_bytes=1000)) as c:
        url = f"/v1/{ns}/entries/fx-graph/k1"
        assert_error(c.put(url, content=b"x" * 1001), 413, "too_large", "1000")
        assert c.head(url).status_code == 404
        assert c.put(url, content=b"x" * 1000).status_code == 201


# ---- issue #17: malformed tar headers, non-canonical packs, deep JSON -------------------------------


def test_pax_record_length_overflow_is_a_400_and_keeps_the_connection(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """A 1000-digit PAX record length made tarfile raise OverflowError: a 500 with two tracebacks,
    and the keep-alive connection dropped. The service no longer lets tarfile see it."""
    _refused(client, ns, kernel, pax_overflow_pack(kernel.manifest, kernel.files), 400, "invalid_pack", "extended tar header")
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201  # same client, same connection


@pytest.mark.parametrize("variant", sorted(NONCANONICAL))
def test_noncanonical_pack_is_refused(client: httpx.Client, ns: str, kernel: Kernel, variant: str) -> None:
    """Valid kernel files with bytes around them that build_pack never writes (a second zstd frame
    of 1 MiB came back intact on GET before): refused, nothing stored."""
    pack = noncanonical_variants(kernel.pack)[variant]
    _refused(client, ns, kernel, pack, 400, "invalid_pack", *NONCANONICAL[variant])


def test_deeply_nested_json_is_a_400(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    files = dict(kernel.files)
    files[f"__grp__{kernel.name}.json"] = b"[" * 100_000
    _refused(client, ns, kernel, forge_pack(manifest_dict(kernel, files), files), 400, "invalid_pack", "not valid JSON")


def test_file_view_of_a_pack_over_the_cap_is_a_413(tmp_path, ns: str, kernel: Kernel) -> None:  # type: ignore[no-untyped-def]
    """An older service stored a pack whose .cubin unpacks to more than the cap (the issue's was
    900 MiB); each file view decompressed all of it. Now it is refused unopened (and a PUT of it
    is a 413 too: tests/test_hostile_memory.py measures the server's memory on the real input)."""
    from api_helpers import inproc_client, make_settings

    cubin = f"{kernel.name}.cubin"
    pack = zero_filled_pack(kernel.manifest, kernel.files, cubin, 96 << 20)  # the cap is 64 MiB
    with inproc_client(make_settings(tmp_path / "data")) as c:
        _refused(c, ns, kernel, pack, 413, "too_large", "decompresses to more than")
        store_as_older_service(tmp_path / "data", ns, kernel.key, pack)
        for name in (cubin, f"{kernel.name}.ptx"):
            assert_error(c.get(f"/v1/{ns}/kernels/{kernel.key}/files/{name}"), 413, "too_large")
        assert c.get(f"/v1/{ns}/kernels/{kernel.key}").content == pack  # still served as stored
        assert_error(c.get(f"/v1/{ns}/kernels/{kernel.key}/files/nope.ptx"), 404, "not_found", "nope.ptx")
