"""Each hook meets a torch it does not know: it leaves torch's original in place, warns once
naming the layer, and never raises. And facts about the environment are never taken from a torch
whose import has not finished."""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import types
from typing import Any

import pytest

from kcache_testkit.pace import HANG_S

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch
from kcache.host import failopen, patching  # noqa: E402
from kcache.host.after_import import imported  # noqa: E402
from kcache.layers.inductor import fx_graph_reads  # noqa: E402
from kcache.store import fx_graph_envelope  # noqa: E402
from kcache.store import kernel_dirs as dirs  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failopen, "_warned", set())
    monkeypatch.delenv("KCACHE_GPU_ARCH", raising=False)


def _half_imported_torch() -> types.ModuleType:
    """What ``sys.modules["torch"]`` is while the main thread is inside ``import torch``: a module
    whose spec says it is initialising, and which lacks most of its attributes."""
    module = types.ModuleType("torch")
    module.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    module.__spec__._initializing = True  # type: ignore[attr-defined]
    return module


def test_local_target_is_not_cached_from_a_half_imported_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix ``local_target`` was ``lru_cache``d: asked during ``import torch`` it cached
    "no GPU" (the half module has no ``cuda`` yet) and the process ran with the arch check off."""
    monkeypatch.setattr(dirs, "_target", [])
    half = _half_imported_torch()
    monkeypatch.setitem(sys.modules, "torch", half)
    assert imported("torch") is None
    assert dirs.local_target() is None  # no answer yet, and none remembered
    # torch finishes importing, on a machine with an H100
    half.cuda = types.SimpleNamespace(is_available=lambda: True, get_device_capability=lambda i: (9, 0))  # type: ignore[attr-defined]
    half.version = types.SimpleNamespace(hip=None)  # type: ignore[attr-defined]
    half.__spec__._initializing = False  # type: ignore[union-attr]
    assert dirs.local_target() == ("cuda", "90")


def test_triton_cache_dir_never_imports_torch_and_never_asks_a_half_imported_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TRITON_HOME", raising=False)
    for name in dirs._INDUCTOR_DIRS:
        half = _half_imported_torch()
        half.triton_cache_dir = lambda device: "/inductor/would/say"  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, half)
    assert dirs.triton_cache_dir() == tmp_path / ".triton" / "cache"
    for name in dirs._INDUCTOR_DIRS:
        sys.modules[name].__spec__._initializing = False  # type: ignore[union-attr]
    assert str(dirs.triton_cache_dir(3)) == "/inductor/would/say"


# ---- FxGraphCache.iterate_over_candidates ------------------------------------------------------------


def _iterate_3(cls: Any, local: bool, remote_cache: Any, key: str) -> Any:  # torch 2.13's shape
    yield from ()


_iterate_3.__annotations__["return"] = "Generator[tuple[T, bytes, bool], None, None]"


def _iterate_2(cls: Any, local: bool, remote_cache: Any, key: str) -> Any:
    yield from ()


_iterate_2.__annotations__["return"] = "Generator[tuple[T, bytes], None, None]"


def _iterate_other(cls: Any, key: str, remote_cache: Any) -> Any:
    yield from ()


def test_candidate_arity_is_read_from_the_signature() -> None:
    from torch._inductor.codecache import FxGraphCache

    assert fx_graph_reads.candidate_arity(_iterate_3) == 3
    assert fx_graph_reads.candidate_arity(_iterate_2) == 2
    assert fx_graph_reads.candidate_arity(_iterate_other) is None
    assert fx_graph_reads.candidate_arity(FxGraphCache.iterate_over_candidates) in (2, 3)  # this torch's own


@pytest.mark.parametrize("shape", [_iterate_other, lambda cls, *a: iter(())])
def test_an_unknown_iterate_over_candidates_is_left_alone_with_one_warning(shape: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from torch._inductor.codecache import FxGraphCache

    unknown = classmethod(shape)
    monkeypatch.setattr(FxGraphCache, "iterate_over_candidates", unknown)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        assert fx_graph_reads.install_fast_reads(lambda backend: True) is False
        assert fx_graph_reads.install_fast_reads(lambda backend: True) is False
    assert FxGraphCache.__dict__["iterate_over_candidates"] is unknown
    warnings = [r.message for r in caplog.records if "iterate_over_candidates" in r.message]
    assert len(warnings) == 1 and "FX-graph" in warnings[0]


def test_a_two_value_iterate_over_candidates_gets_two_value_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.9's shape: the caller unpacks two values; a third would kill the compile."""
    import pickle

    from torch._inductor.codecache import FxGraphCache

    on_disk = [("local-graph", b"L")]

    def iterate(cls: Any, local: bool, remote_cache: Any, key: str) -> Any:
        yield from on_disk if local else []

    iterate.__annotations__["return"] = "Generator[tuple[T, bytes], None, None]"
    monkeypatch.setattr(FxGraphCache, "iterate_over_candidates", classmethod(iterate))

    class Backend:
        def get_stored(self, key: str) -> bytes:
            return fx_graph_envelope.encode(b'{"data": "' + __import__("base64").b64encode(pickle.dumps("remote-graph")) + b'"}') or b""

    class Remote:
        backend = Backend()

    try:
        assert fx_graph_reads.install_fast_reads(lambda backend: isinstance(backend, Backend))
        got = list(FxGraphCache.iterate_over_candidates(True, Remote(), "k"))
    finally:
        fx_graph_reads.uninstall_fast_reads()
    assert got == [("local-graph", b"L"), ("remote-graph", pickle.dumps("remote-graph"))]
    assert all(len(candidate) == 2 for candidate in got)


# ---- TritonBundler, the remote caches, the autotune recheck ---------------------------------------------


def test_a_tritonbundler_without_its_methods_is_left_alone(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from kcache.layers.inductor.triton_bundler import PATCHES, install_bundler_hooks
    from torch._inductor.triton_bundler import TritonBundler

    monkeypatch.delattr(TritonBundler, "read_and_emit")
    before = dict(vars(TritonBundler))
    with caplog.at_level(logging.WARNING, logger="kcache"):
        assert install_bundler_hooks() is False
    assert dict(vars(TritonBundler)) == before and not patching.is_patched(PATCHES)
    assert any("TritonBundler" in r.message for r in caplog.records)


def test_a_remote_cache_class_without_backend_override_is_not_served(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from kcache.layers.inductor.remote_caches import install_remote_caches, uninstall_remote_caches
    from torch._inductor import remote_cache

    class NoOverride:  # a torch whose RemoteAutotuneCache has no hook for a backend
        pass

    monkeypatch.setattr(remote_cache, "RemoteAutotuneCache", NoOverride)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        served = install_remote_caches(["autotune", "fx-graph"])
    try:
        assert served == ["fx-graph"]
        assert not hasattr(NoOverride, "backend_override_cls")
        assert any("layer autotune not served" in r.message for r in caplog.records)
    finally:
        uninstall_remote_caches()
    assert remote_cache.RemoteFxGraphCache.__dict__.get("backend_override_cls") is None


def test_the_recheck_wrapper_runs_torchs_recheck_even_when_kcaches_part_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.layers.inductor import coordesc_reuse
    from torch._inductor.runtime import triton_heuristics as th

    calls: list[str] = []

    def recheck(self: Any, reload_kernel_from_src: Any) -> None:
        calls.append("torch")
        th.check_autotune_cache(["cfg"], None, {})

    monkeypatch.setattr(th.CachingAutotuner, "recheck_autotune_cache", recheck)
    monkeypatch.setattr(th, "check_autotune_cache", lambda *a, **k: ([types.SimpleNamespace(found_by_coordesc=True)], None, None))

    class Odd:  # an autotuner missing what kcache's part reads (a torch 2.15 lazily built one)
        inductor_meta = {"coordinate_descent_tuning": True}

        @property
        def compile_results(self) -> Any:
            raise AttributeError("size_hints")

    assert coordesc_reuse.install()
    try:
        th.CachingAutotuner.recheck_autotune_cache(Odd(), None)  # must not raise
    finally:
        coordesc_reuse.uninstall()
    assert calls == ["torch"]
    assert th.CachingAutotuner.recheck_autotune_cache is recheck


def test_the_fingerprint_is_the_same_before_and_after_import_torch(tmp_path: Any) -> None:
    """A workload is prefetched under the fingerprint of interpreter start and published under
    the one at exit. Before the fix ``cuda`` was None before ``import torch`` and torch's CUDA
    version after it on registry (CUDA) wheels, so a published workload was never found again."""
    import subprocess

    script = (
        "import json, kcache.store.fingerprint as fp\n"
        "before = fp.current().model_dump(); fp.current.cache_clear()\n"
        "import torch\n"
        "after = fp.current().model_dump()\n"
        "print(json.dumps([before, after, torch.version.cuda, torch.version.hip]))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("KCACHE_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**env, "KCACHE_AUTOLOAD": "0"}, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, cuda, hip = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert before == after
    assert (after["cuda"], after["hip"]) == (cuda, hip)
    # the distribution's version: "2.9.1" for a registry wheel whose torch.__version__ is "2.9.1+cu128"
    assert torch.__version__.split("+")[0] == after["torch"].split("+")[0]
