"""The kernel pack format on real Triton kernel dirs (compiled for sm_90 on the CPU)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tracemalloc
from pathlib import Path

import pytest
import zstandard
from kcache_schemas import PackError, PackLimits, Producer, build_pack, pack_kernel_dir, read_pack
from kcache_schemas.error_codes import ErrorCode
from kcache_schemas.pack import (
    MANIFEST_NAME,
    _canonical_headers,
    manifest_for_files,
    pack_work_bytes,
    read_kernel_dir,
    read_pack_file,
    substitute_dir,
    verify_pack,
)

from kcache_testkit.kernels import Kernel

pytest.register_assert_rewrite("api_helpers")

from api_helpers import forge_pack, manifest_dict, member, raw_pack  # noqa: E402

from kcache_testkit.hostile_packs import noncanonical_variants, pax_overflow_pack, zero_filled_pack  # noqa: E402

pytest_plugins = ["api_helpers"]


def _disk_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def test_real_kernel_dirs_have_the_triton_layout(kernels: list[Kernel]) -> None:
    for k in kernels:
        names = set(_disk_files(k.dir))
        stem = k.name
        assert {f"{stem}.{s}" for s in ("source", "ttir", "ttgir", "llir", "ptx", "cubin", "json")} | {
            f"__grp__{stem}.json"
        } == names
        assert k.manifest.target.device_type.value == "cuda"
        assert k.manifest.target.arch == "90"
        assert k.manifest.target.warp_size == 32


def test_pack_roundtrip_gives_identical_files(kernels: list[Kernel]) -> None:
    for k in kernels:
        manifest, files = read_pack(k.pack)
        assert manifest == k.manifest
        assert manifest.key == k.key
        assert files == read_kernel_dir(k.dir)
        # Substituting the real dir back gives the bytes Triton wrote.
        assert substitute_dir(files, str(k.dir)) == _disk_files(k.dir)


def test_packs_are_path_free(kernels: list[Kernel]) -> None:
    for k in kernels:
        raw = zstandard.ZstdDecompressor().decompress(k.pack, max_output_size=1 << 26)
        assert str(k.dir).encode() not in raw
        assert str(k.dir.parent).encode() not in raw
        group = json.loads(k.files[f"__grp__{k.name}.json"])
        assert group["child_paths"] == {
            n: f"[REPLACE]/{n}" for n in k.files if not n.startswith("__grp__")
        }


def test_packing_is_deterministic(kernels: list[Kernel], tmp_path: Path) -> None:
    k = kernels[1]
    first = pack_kernel_dir(k.dir)[1]
    assert pack_kernel_dir(k.dir)[1] == first == k.pack
    # Same files at another path, with other mtimes and modes: still the same bytes.
    copy = tmp_path / "elsewhere" / k.key
    shutil.copytree(k.dir, copy)
    for p in copy.iterdir():
        os.utime(p, (1, 1))
        p.chmod(0o600)
        if p.suffix == ".json":
            p.write_bytes(p.read_bytes().replace(str(k.dir).encode(), str(copy).encode()))
    assert pack_kernel_dir(copy)[1] == first


def test_compression_ratio_on_real_kernels(kernels: list[Kernel]) -> None:
    total = sum(k.manifest.total_size for k in kernels)
    packed = sum(len(k.pack) for k in kernels)
    assert total / packed > 2, (total, packed)
    for k in kernels:
        assert k.manifest.total_size == sum(len(b) for b in k.files.values())


def test_pack_inspects_like_zstd_dc_tar_t(kernel: Kernel) -> None:
    # zstd -dc X.kpack | tar tv
    raw = zstandard.ZstdDecompressor().decompress(kernel.pack, max_output_size=1 << 26)
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        members = tf.getmembers()
        assert members[0].name == MANIFEST_NAME
        assert [m.name for m in members[1:]] == [f.name for f in kernel.manifest.files]
        for m in members:
            assert m.isreg() and m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644
        fh = tf.extractfile(members[0])
        assert fh is not None
        manifest = json.loads(fh.read())
        assert manifest["key"] == kernel.key and manifest["format"] == "kcache-pack"
        for m in members[1:]:
            fh = tf.extractfile(m)
            assert fh is not None and fh.read() == kernel.files[m.name]


def test_pack_carries_producer(kernel: Kernel) -> None:
    producer = Producer(kcache_version="0.1.0", triton_version="3.9.0", compile_time_s=1.5)
    manifest, pack = pack_kernel_dir(kernel.dir, producer=producer)
    assert read_pack(pack)[0].producer == producer
    assert manifest.content_digest == kernel.manifest.content_digest


def test_manifest_for_files_accepts_hex_key(kernel: Kernel) -> None:
    m = manifest_for_files(kernel.hex_key, kernel.files)
    assert m.key == kernel.key
    assert build_pack(m, kernel.files) == kernel.pack


def test_manifest_for_files_refuses_a_changed_key(kernel: Kernel, kernels: list[Kernel]) -> None:
    with pytest.raises(PackError, match="pack is for kernel") as exc:
        manifest_for_files(kernels[1].key, kernel.files)
    assert exc.value.code is ErrorCode.KEY_MISMATCH


def test_manifest_for_files_refuses_an_absolute_child_path(kernel: Kernel) -> None:
    files = dict(kernel.files)
    grp = f"__grp__{kernel.name}.json"
    group = json.loads(files[grp])
    group["child_paths"][f"{kernel.name}.ptx"] = "/etc/passwd"
    files[grp] = json.dumps(group).encode()
    with pytest.raises(PackError, match="/etc/passwd"):
        manifest_for_files(kernel.key, files)


def test_pack_kernel_dir_ignores_triton_temp_files(kernel: Kernel, tmp_path: Path) -> None:
    copy = tmp_path / kernel.key
    shutil.copytree(kernel.dir, copy)
    (copy / "lock").write_text("")
    (copy / "tmp.123abc").mkdir()
    for p in copy.iterdir():
        if p.suffix == ".json":
            p.write_bytes(p.read_bytes().replace(str(kernel.dir).encode(), str(copy).encode()))
    assert pack_kernel_dir(copy)[1] == kernel.pack


def test_read_pack_rejects_a_truncated_pack(kernel: Kernel) -> None:
    for cut in (len(kernel.pack) // 2, len(kernel.pack) - 1, 10, 0):
        with pytest.raises(PackError):
            read_pack(kernel.pack[:cut])


def test_read_pack_limits(kernel: Kernel) -> None:
    with pytest.raises(PackError, match="limit") as exc:
        read_pack(kernel.pack, PackLimits(max_unpacked_bytes=kernel.manifest.total_size - 1))
    assert exc.value.code is ErrorCode.TOO_LARGE
    with pytest.raises(PackError, match="files, limit"):
        read_pack(kernel.pack, PackLimits(max_files=len(kernel.files) - 1))
    assert read_pack(kernel.pack, PackLimits(max_unpacked_bytes=kernel.manifest.total_size))


def test_read_pack_rejects_a_hidden_extra_member(kernel: Kernel) -> None:
    members = [member(MANIFEST_NAME, kernel.manifest.model_dump_json().encode())]
    members += [member(f.name, kernel.files[f.name]) for f in kernel.manifest.files]
    assert read_pack(raw_pack(members))[1] == kernel.files
    with pytest.raises(PackError, match="not named by the manifest"):
        read_pack(raw_pack([*members, member("extra.bin", b"x")]))


def test_read_pack_rejects_sentinel_outside_json(kernel: Kernel) -> None:
    files = dict(kernel.files)
    files[f"{kernel.name}.ptx"] += b"\n// [REPLACE]\n"
    with pytest.raises(PackError, match=r"\[REPLACE\]"):
        read_pack(forge_pack(manifest_dict(kernel, files), files))


# ---- TritonBundler: what Inductor actually ships ---------------------------------------------


@pytest.mark.torch
def test_read_kernel_dir_equals_triton_bundler_collect(
    bundler_artifacts: dict[str, dict[str, bytes]], kernels: list[Kernel]
) -> None:
    assert set(bundler_artifacts) == {k.key for k in kernels[:2]}
    for k in kernels[:2]:
        payloads = bundler_artifacts[k.key]
        assert read_kernel_dir(k.dir) == payloads
        manifest = manifest_for_files(k.key, payloads)
        assert build_pack(manifest, payloads) == k.pack


# ---- the canonical form (issue #17): what build_pack writes is all the service stores ----------


def _renamed(k: Kernel, name: str) -> dict[str, bytes]:
    """The kernel's files as if Triton had named the kernel ``name`` (same key: the key is the
    metadata's hash, not its name)."""
    files: dict[str, bytes] = {}
    for fname, data in k.files.items():
        new = fname.replace(k.name, name)
        if fname == f"{k.name}.json":
            data = json.dumps(json.loads(data) | {"name": name}).encode()
        elif fname == f"__grp__{k.name}.json":
            group = json.loads(data)
            group["child_paths"] = {c.replace(k.name, name): p.replace(k.name, name) for c, p in group["child_paths"].items()}
            data = json.dumps(group).encode()
        files[new] = data
    return files


@pytest.mark.parametrize("length", [1, 99, 100, 101, 150, 200])
def test_canonical_headers_are_what_tarfile_writes(length: int) -> None:
    """The reader compares header bytes with its own copy of tarfile's encoder (PAX "path" record
    for names over 100 bytes). This Python's tarfile is what build_pack uses."""
    name = ("k" * length)[:length]
    for size in (0, 1, 511, 512, 10 << 20):
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o644, 0
        assert info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape") in _canonical_headers(name, size)


@pytest.mark.parametrize("level", [1, 3, 19])
def test_build_pack_writes_canonical_packs(kernel: Kernel, level: int) -> None:
    pack = build_pack(kernel.manifest, kernel.files, level)
    assert verify_pack(pack) == kernel.manifest
    assert read_pack(pack) == (kernel.manifest, kernel.files)


def test_long_file_names_take_pax_headers_and_stay_canonical(kernel: Kernel) -> None:
    """Inductor's fused kernel names run past tar's 100-byte name field."""
    files = _renamed(kernel, "triton_red_fused_" + "native_batch_norm_backward_" * 5)
    assert max(map(len, files)) > 150
    manifest = manifest_for_files(kernel.key, files)
    pack = build_pack(manifest, files)
    raw = zstandard.ZstdDecompressor().decompress(pack)
    assert b" path=" in raw  # PAX records were written
    assert verify_pack(pack) == manifest
    assert read_pack(pack)[1] == files
    longest = max(files, key=len)
    assert read_pack_file(pack, longest) == (manifest, files[longest])


def test_noncanonical_packs_are_refused_for_storing_and_still_read(kernel: Kernel) -> None:
    """Older services stored such packs byte for byte: clients keep reading them (the lenient
    reader), the service's upload check refuses them."""
    for variant, pack in noncanonical_variants(kernel.pack).items():
        with pytest.raises(PackError) as exc:
            verify_pack(pack)
        assert exc.value.code is ErrorCode.INVALID_PACK, variant
        if variant == "garbage-after-frame":  # the old reader refused it too: not a zstd frame
            with pytest.raises(PackError, match="not a zstd-compressed tar"):
                read_pack(pack)
        else:
            assert read_pack(pack) == (kernel.manifest, kernel.files), variant
            ptx = f"{kernel.name}.ptx"
            assert read_pack_file(pack, ptx) == (kernel.manifest, kernel.files[ptx]), variant


def test_pax_record_length_overflow_is_a_pack_error(kernel: Kernel) -> None:
    """A 1000-digit PAX record length made tarfile raise OverflowError (a 500 upstream)."""
    pack = pax_overflow_pack(kernel.manifest, kernel.files)
    with pytest.raises(PackError, match="extended tar header"):
        verify_pack(pack)
    with pytest.raises(PackError, match="OverflowError"):
        read_pack(pack)


def test_deeply_nested_json_is_a_pack_error(kernel: Kernel) -> None:
    """json.loads raises RecursionError on deep nesting, which is no JSONDecodeError."""
    files = dict(kernel.files)
    files[f"{kernel.name}.json"] = b"[" * 100_000
    pack = forge_pack(manifest_dict(kernel, files), files)
    for read in (verify_pack, read_pack):
        with pytest.raises(PackError, match="not valid JSON"):
            read(pack)


def test_json_files_are_capped(kernel: Kernel) -> None:
    with pytest.raises(PackError, match="bytes of JSON, limit") as exc:
        read_pack(kernel.pack, PackLimits(max_json_bytes=100))
    assert exc.value.code is ErrorCode.TOO_LARGE


def test_verify_streams_a_big_pack_in_bounded_memory(kernel: Kernel) -> None:
    """Past 8 MiB of tar the reader streams: each file is hashed as it decompresses and only the
    .json files and the one file asked for are held (tracemalloc sees every bytes object)."""
    cubin, ptx = f"{kernel.name}.cubin", f"{kernel.name}.ptx"
    pack = zero_filled_pack(kernel.manifest, kernel.files, cubin, 40 << 20)
    assert len(pack) < 100_000

    def peak_mib(fn):  # type: ignore[no-untyped-def]
        tracemalloc.start()
        try:
            result = fn()
            return result, tracemalloc.get_traced_memory()[1] / (1 << 20)
        finally:
            tracemalloc.stop()

    manifest, peak = peak_mib(lambda: verify_pack(pack))
    assert manifest.total_size > 40 << 20 and peak < 6, peak
    (_m, data), peak = peak_mib(lambda: read_pack_file(pack, ptx))  # stored after the .cubin
    assert data == kernel.files[ptx] and peak < 6, peak
    (_m, data), peak = peak_mib(lambda: read_pack_file(pack, cubin))
    assert data == bytes(40 << 20) and peak < 48, peak  # the file itself, once
    assert read_pack_file(pack, "no-such-file.ptx") == (manifest, None)
    with pytest.raises(PackError, match="decompresses to more than the allowed") as exc:
        verify_pack(pack, PackLimits(max_unpacked_bytes=32 << 20))  # from the frame header alone
    assert exc.value.code is ErrorCode.TOO_LARGE


def test_sentinel_across_a_chunk_boundary_is_found(kernel: Kernel) -> None:
    """The streaming reader checks non-.json files for [REPLACE] in 1 MiB chunks, and across them."""
    ptx = f"{kernel.name}.ptx"
    files = dict(kernel.files)
    files[ptx] = b"/" * ((1 << 20) - 4) + b"[REPLACE]" + b"/" * (9 << 20)
    pack = forge_pack(manifest_dict(kernel, files), files)
    assert zstandard.frame_content_size(pack) > 8 << 20  # the streaming path
    with pytest.raises(PackError, match=r"\[REPLACE\] sentinel"):
        verify_pack(pack)


def test_pack_work_bytes(kernel: Kernel) -> None:
    limits = PackLimits()
    assert pack_work_bytes(kernel.pack, limits) == 2 * zstandard.frame_content_size(kernel.pack)
    streamed = zero_filled_pack(kernel.manifest, kernel.files, f"{kernel.name}.cubin", 40 << 20)
    window = zstandard.get_frame_parameters(streamed).window_size
    assert pack_work_bytes(streamed, limits) == window + (2 << 20) + 2 * limits.max_json_bytes < 12 << 20
    assert pack_work_bytes(streamed, PackLimits(max_unpacked_bytes=16 << 20)) == 0  # refused unopened
    assert pack_work_bytes(b"not a pack") == 0
