"""kcache's hooks driven by torch's real TritonBundler (CPU build) over real Triton kernel dirs."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import kcache  # noqa: E402
from kcache.bundler_hooks import _kernel_artifacts, _with_kernels  # noqa: E402
from kcache.config import ClientConfig  # noqa: E402
from kcache.http import KcacheClient  # noqa: E402
from kcache.runtime import get_runtime  # noqa: E402
from kcache_schemas.pack import read_kernel_dir  # noqa: E402
from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor.triton_bundler import TritonBundler  # noqa: E402

pytest_plugins = ["live"]


def _collect(kernel_dirs: list[Path], monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(kernel_dirs[0].parent))
    with inductor_config.patch(bundle_triton_into_fx_graph_cache=True):
        TritonBundler.begin_compile()
        for d in kernel_dirs:
            TritonBundler.put(d.name, 0)
        return TritonBundler.collect()


def test_collect_uploads_every_kernel_in_the_background(live_service, real_kernel_dirs, monkeypatch) -> None:
    originals = {n: TritonBundler.__dict__[n] for n in ("begin_compile", "put", "collect", "read_and_emit")}
    assert kcache.install(url=live_service.url)
    try:
        assert TritonBundler.__dict__["collect"] is not originals["collect"]
        t0 = time.perf_counter()
        bundle, meta = _collect(real_kernel_dirs, monkeypatch)
        collect_s = time.perf_counter() - t0
        assert len(bundle.kernel_artifacts) == len(real_kernel_dirs)  # Inductor's result untouched
        assert meta is not None and len(meta.cached_kernel_names) == len(real_kernel_dirs)
        rt = get_runtime()
        assert rt is not None and rt.uploader is not None
        assert rt.uploader.flush(10)
        assert rt.used_kernels >= {d.name for d in real_kernel_dirs}
        stats = rt.stats.snapshot()["kernel"]
        assert stats["puts"] == len(real_kernel_dirs) and stats["put_errors"] == 0
    finally:
        kcache.uninstall()
    # Uninstall restores Inductor's own methods exactly.
    assert all(TritonBundler.__dict__[n] is originals[n] for n in originals)
    client = KcacheClient(ClientConfig(url=live_service.url))
    assert client.missing([d.name for d in real_kernel_dirs]) == []
    # The service holds exactly what collect() produced ([REPLACE] form), byte for byte.
    for ka in bundle.kernel_artifacts:
        from kcache_schemas.pack import read_pack

        _m, files = read_pack(client.get_pack(ka.kernel_hash))
        assert files == {a.filename: a.payload for a in ka.artifacts}
    assert collect_s < 1.0  # uploads happen off the compile path


_READ_AND_EMIT = textwrap.dedent(
    """
    import pickle, sys, json
    import kcache
    from torch._inductor import config
    from torch._inductor.triton_bundler import TritonBundler
    from torch._dynamo.utils import counters
    assert kcache.install(url=sys.argv[2])
    bundle = pickle.load(open(sys.argv[1], "rb"))
    with config.patch(bundle_triton_into_fx_graph_cache=True):
        meta = TritonBundler.read_and_emit(bundle)
    print(json.dumps({"names": sorted(meta.cached_kernel_names),
                      "emitted": counters["inductor"]["triton_bundler_read_and_emit_kernel"]}))
    """
)


def test_fresh_process_read_and_emit_restores_identical_dirs(live_service, real_kernel_dirs, monkeypatch, tmp_path: Path) -> None:
    bundle, meta = _collect(real_kernel_dirs, monkeypatch)
    bundle_file = tmp_path / "bundle.pkl"
    bundle_file.write_bytes(pickle.dumps(bundle))
    node = tmp_path / "fresh-node-triton"
    # A corrupt leftover: Inductor's own read_and_emit would bail on a non-empty dir; kcache repairs it.
    broken = node / real_kernel_dirs[0].name
    broken.mkdir(parents=True)
    (broken / "junk.cubin").write_bytes(b"\0" * 10)
    import os

    os.utime(broken, (time.time() - 7200,) * 2)
    env = {**os.environ, "TRITON_CACHE_DIR": str(node), "KCACHE_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", _READ_AND_EMIT, str(bundle_file), live_service.url], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert meta is not None
    assert result["names"] == sorted(meta.cached_kernel_names)  # Inductor's return contract kept
    assert result["emitted"] == sum(len(ka.artifacts) for ka in bundle.kernel_artifacts)
    for d in real_kernel_dirs:
        assert read_kernel_dir(node / d.name) == read_kernel_dir(d)  # byte-identical after [REPLACE]
    assert any(p.name.startswith("quarantine.") for p in node.iterdir())


def test_bundle_shapes_old_and_new() -> None:
    from torch._inductor.triton_bundler import TritonBundle, TritonKernelArtifacts

    kas = [TritonKernelArtifacts("K", 0, [])]
    new = TritonBundle(kas, [])
    assert _kernel_artifacts(new) == kas and _kernel_artifacts(kas) == kas  # torch >= 2.7 and < 2.7
    assert _with_kernels(new, []).kernel_artifacts == [] and _with_kernels(new, []).static_autotuners == []
    assert _with_kernels(kas, []) == []
    with pytest.raises(TypeError):
        _kernel_artifacts(object())


def test_a_kernel_hit_credits_the_producers_compile_time(live_service, real_kernel_dirs, monkeypatch, tmp_path: Path) -> None:
    from kcache.runtime import Runtime

    assert kcache.install(url=live_service.url)
    try:
        _collect(real_kernel_dirs, monkeypatch)  # begin_compile..collect: uploads with a compile-time share
        rt = get_runtime()
        assert rt is not None and rt.uploader is not None and rt.uploader.flush(10)
    finally:
        kcache.uninstall()
    node = Runtime(ClientConfig(url=live_service.url, check_target=False))
    for d in real_kernel_dirs:
        assert node.fetch_kernel(d.name, tmp_path / "triton") is not None
    stats = node.stats.snapshot()["kernel"]
    assert stats["hits"] == len(real_kernel_dirs)
    produced = sum(KcacheClient(ClientConfig(url=live_service.url)).manifest(d.name).producer.compile_time_s or 0 for d in real_kernel_dirs)
    assert produced > 0 and stats["saved_s"] == pytest.approx(produced, rel=1e-3)
    node.close()


def test_a_kernel_kcache_cannot_emit_falls_back_to_inductor_while_the_rest_are_emitted(
    real_kernel_dirs, monkeypatch, tmp_path: Path
) -> None:
    from torch._inductor.triton_bundler import TritonKernelArtifacts

    bundle, _meta = _collect(real_kernel_dirs, monkeypatch)
    good = list(bundle.kernel_artifacts)
    # Not a Triton key (kcache's emitter refuses it as a path); Inductor's own code still writes it.
    odd = TritonKernelArtifacts("not_a_triton_key", good[0].device, good[0].artifacts)
    node = tmp_path / "node-triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(node))
    assert kcache.install(url="http://127.0.0.1:9")
    try:
        with inductor_config.patch(bundle_triton_into_fx_graph_cache=True):
            meta = TritonBundler.read_and_emit(_with_kernels(bundle, [*good[:2], odd, *good[2:]]))
    finally:
        kcache.uninstall()
    for d in real_kernel_dirs:
        assert read_kernel_dir(node / d.name) == read_kernel_dir(d)
    assert (node / "not_a_triton_key").is_dir()  # written by Inductor's read_and_emit
    assert meta is not None and len(meta.cached_kernel_names) == len(real_kernel_dirs) + 1


def test_a_warm_node_keeps_its_kernel_dirs_and_a_truncated_one_is_repaired(real_kernel_dirs, monkeypatch, tmp_path: Path) -> None:
    import os
    import shutil

    bundle, _meta = _collect(real_kernel_dirs, monkeypatch)
    node = tmp_path / "warm-node-triton"
    for d in real_kernel_dirs:  # the node compiled these itself earlier
        shutil.copytree(d, node / d.name)
    before = {d.name: os.stat(node / d.name).st_ino for d in real_kernel_dirs}
    victim = real_kernel_dirs[1]
    cubin = next(p for p in (node / victim.name).iterdir() if p.suffix == ".cubin")
    cubin.write_bytes(cubin.read_bytes()[:100])  # a crash mid-write left it short
    os.utime(node / victim.name, (time.time() - 7200,) * 2)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(node))
    assert kcache.install(url="http://127.0.0.1:9")
    try:
        with inductor_config.patch(bundle_triton_into_fx_graph_cache=True):
            meta = TritonBundler.read_and_emit(bundle)
    finally:
        kcache.uninstall()
    assert meta is not None and len(meta.cached_kernel_names) == len(real_kernel_dirs)
    for d in real_kernel_dirs:
        assert read_kernel_dir(node / d.name) == read_kernel_dir(d)
        kept = os.stat(node / d.name).st_ino == before[d.name]
        assert kept == (d != victim), d.name  # whole dirs left alone; the short one replaced
    assert any(p.name.startswith("quarantine.") for p in node.iterdir())
