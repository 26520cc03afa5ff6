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

pytestmark = pytest.mark.torch
import kcache  # noqa: E402
from kcache.config import ClientConfig  # noqa: E402
from kcache.current import get_runtime  # noqa: E402
from kcache.layers.inductor.triton_bundler import _kernel_artifacts, _with_kernels  # noqa: E402
from kcache.transport.http import KcacheClient  # noqa: E402
from kcache_schemas.pack import read_kernel_dir  # noqa: E402
from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor.triton_bundler import TritonBundler  # noqa: E402

from kcache_testkit.pace import HANG_S, bound  # noqa: E402

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
        assert stats.puts == len(real_kernel_dirs) and stats.put_errors == 0
    finally:
        kcache.uninstall()
    # Uninstall restores Inductor's own methods exactly.
    assert all(TritonBundler.__dict__[n] is originals[n] for n in originals)
    client = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))
    assert client.missing([d.name for d in real_kernel_dirs]) == []
    # The service holds exactly what collect() produced ([REPLACE] form), byte for byte.
    for ka in bundle.kernel_artifacts:
        from kcache_schemas.pack import read_pack

        _m, files = read_pack(client.get_pack(ka.kernel_hash))
        assert files == {a.filename: a.payload for a in ka.artifacts}
    assert collect_s < bound(0, 2_000)  # ~1 s idle: uploads happen off the compile path


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
    out = subprocess.run([sys.executable, "-c", _READ_AND_EMIT, str(bundle_file), live_service.url], env=env, capture_output=True, text=True, timeout=HANG_S)
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
    assert stats.hits == len(real_kernel_dirs)
    produced = sum(KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S)).manifest(d.name).producer.compile_time_s or 0 for d in real_kernel_dirs)
    assert produced > 0 and stats.saved_s == pytest.approx(produced, rel=1e-3)
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


# ---- install, reinstall, uninstall: one way to the runtime ---------------------------------------


def _kernels_in(url: str, namespace: str, keys: list[str]) -> list[str]:
    client = KcacheClient(ClientConfig(url=url, namespace=namespace, read_timeout_s=HANG_S))
    try:
        return sorted(set(keys) - set(client.missing(keys)))
    finally:
        client.close()


@pytest.mark.parametrize("first", ["install", "autoload"])
def test_a_second_install_with_other_options_is_the_one_the_bundler_hooks_use(
    first: str, live_service, real_kernel_dirs, monkeypatch
) -> None:
    """Before the fix the bundler hooks kept the first runtime: kernels collected after
    ``install(namespace="b")`` were uploaded to ``a`` by the old, closed runtime."""
    keys = [d.name for d in real_kernel_dirs]
    if first == "autoload":  # what the .pth does: install() from the environment alone
        monkeypatch.setenv("KCACHE_URL", live_service.url)
        monkeypatch.setenv("KCACHE_NAMESPACE", "a")
        assert kcache.install()
    else:
        assert kcache.install(url=live_service.url, namespace="a")
    try:
        assert kcache.install(url=live_service.url, namespace="b")
        _collect(real_kernel_dirs, monkeypatch)
        rt = get_runtime()
        assert rt is not None and rt.config.namespace == "b"
        assert rt.uploader is not None and rt.uploader.flush(10)
    finally:
        kcache.uninstall()
    assert _kernels_in(live_service.url, "b", keys) == sorted(keys)
    assert _kernels_in(live_service.url, "a", keys) == []


def test_uninstall_then_install_hooks_once_and_uses_the_new_runtime(live_service, real_kernel_dirs, monkeypatch) -> None:
    originals = {n: TritonBundler.__dict__[n] for n in ("begin_compile", "put", "collect", "read_and_emit")}
    keys = [d.name for d in real_kernel_dirs]
    assert kcache.install(url=live_service.url, namespace="first")
    kcache.uninstall()
    assert all(TritonBundler.__dict__[n] is originals[n] for n in originals)
    _collect(real_kernel_dirs, monkeypatch)  # not installed: nothing of kcache runs
    assert get_runtime() is None
    assert kcache.install(url=live_service.url, namespace="second")
    assert kcache.install(url=live_service.url, namespace="second")  # the same again: no-op
    try:
        assert TritonBundler.__dict__["collect"] is not originals["collect"]
        _collect(real_kernel_dirs, monkeypatch)
        rt = get_runtime()
        assert rt is not None and rt.uploader is not None and rt.uploader.flush(10)
        assert rt.stats.snapshot()["kernel"].puts == len(keys)  # hooked once: one upload each
    finally:
        kcache.uninstall()
    assert all(TritonBundler.__dict__[n] is originals[n] for n in originals)
    assert _kernels_in(live_service.url, "second", keys) == sorted(keys)
    assert _kernels_in(live_service.url, "first", keys) == []


# ---- exit right after a compile ---------------------------------------------------------------------

_COLLECT_AND_EXIT = textwrap.dedent(
    """
    import json, sys
    import kcache
    from kcache_testkit.corpus import compile_small
    from torch._inductor import config
    from torch._inductor.runtime.runtime_utils import triton_cache_dir
    from torch._inductor.triton_bundler import TritonBundler
    assert kcache.install(url=sys.argv[1])
    # Real kernels in Inductor's default dir under TMPDIR (no TRITON_CACHE_DIR), as a compile leaves them.
    dirs = compile_small(triton_cache_dir(0), count=3)
    with config.patch(bundle_triton_into_fx_graph_cache=True):
        TritonBundler.begin_compile()
        for d in dirs:
            TritonBundler.put(d.name, 0)
        TritonBundler.collect()
    if sys.argv[2] == "uninstall":
        kcache.uninstall()
    print("KEYS " + json.dumps([d.name for d in dirs]))
    """
)


@pytest.mark.parametrize("ending", ["exit", "uninstall"])
def test_a_job_that_exits_right_after_collect_still_uploads(ending: str, live_service, tmp_path: Path) -> None:
    """Before the fix, exit waited for uploads only if the service had already answered this
    process: a job whose first contact was its own upload lost every kernel."""
    import json
    import os

    from kcache_testkit.service import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TRITON_", "TORCHINDUCTOR_"))}
    # KCACHE_TRITON_MANAGER=0: the kernels' own compile asks nothing of the service, so the
    # uploads are this process's first contact with it.
    env.update(KCACHE_AUTOLOAD="0", KCACHE_TRITON_MANAGER="0", HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path), PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", _COLLECT_AND_EXIT, live_service.url, ending], env=env, capture_output=True, text=True, timeout=HANG_S,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    keys = json.loads(out.stdout.split("KEYS ", 1)[1])
    assert len(keys) == 3
    assert _kernels_in(live_service.url, "default", keys) == sorted(keys)


@pytest.mark.parametrize("signing", [False, True], ids=["unsigned", "signing-configured"])
def test_a_pre_emitted_build_of_a_kernel_stays_when_the_bundle_carries_another_build(
    signing: bool, real_kernel_dirs, monkeypatch, tmp_path: Path, caplog,
) -> None:
    """H200s (h5a/h5c): every kcache node of a max-autotune graph quarantined two template kernels
    ("incomplete or corrupt") that the pre-emit had written whole from the workload's packs: the
    FX entry's bundle carried another build of the same keys (compiled once in an autotune
    benchmark process, once for the graph) whose ``.ptx`` differed in a debug path. With signing
    configured the bundle (from a signed FX entry) wins over an unsigned pack's dir, as before."""
    import logging
    import os

    from kcache.store.emitter import EmitOutcome, emit_pack
    from kcache_schemas import wire
    from kcache_schemas.pack import build_pack, manifest_for_files
    from torch._inductor.triton_bundler import TritonKernelArtifact, TritonKernelArtifacts

    bundle, _meta = _collect(real_kernel_dirs, monkeypatch)
    node = tmp_path / "node-triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(node))
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path / "kcache-local"))
    if signing:
        monkeypatch.setenv("KCACHE_SIGNING_KEY", "fleet-secret")
    assert kcache.install(url="http://127.0.0.1:9")
    try:
        rt = get_runtime()
        assert rt is not None
        for d in real_kernel_dirs:  # what the prefetch holds and the pre-emit writes ahead
            files = read_kernel_dir(d)
            pack = build_pack(manifest_for_files(d.name, files), files)
            rt.local.put(wire.CacheLayer.KERNEL.value, d.name, pack)
            assert emit_pack(node, pack, expected_key=d.name, check_target=False) is EmitOutcome.EMITTED
        before = {d.name: os.stat(node / d.name).st_ino for d in real_kernel_dirs}
        kernels = list(bundle.kernel_artifacts)
        other = kernels[1]
        rebuilt = [TritonKernelArtifact(a.filename, a.payload + b"//" if a.filename.endswith(".ptx") else a.payload)
                   for a in other.artifacts]
        assert any(a.filename.endswith(".ptx") for a in rebuilt)
        kernels[1] = TritonKernelArtifacts(other.kernel_hash, other.device, rebuilt)
        with caplog.at_level(logging.WARNING, logger="kcache"), inductor_config.patch(bundle_triton_into_fx_graph_cache=True):
            meta = TritonBundler.read_and_emit(_with_kernels(bundle, kernels))
        assert rt.used_kernels >= {d.name for d in real_kernel_dirs}  # found on disk, each one
    finally:
        kcache.uninstall()
    assert meta is not None and len(meta.cached_kernel_names) == len(real_kernel_dirs)
    after = {d.name: os.stat(node / d.name).st_ino for d in real_kernel_dirs}
    quarantined = [p for p in node.iterdir() if p.name.startswith("quarantine.")]
    if signing:  # the signed entry's build replaced the pack's
        assert after == {**before, other.kernel_hash: after[other.kernel_hash]} != before
        assert len(quarantined) == 1 and "quarantined" in caplog.text
        return
    assert after == before  # every dir kept
    assert not quarantined and "quarantined" not in caplog.text
    for d in real_kernel_dirs:
        assert read_kernel_dir(node / d.name) == read_kernel_dir(d)
