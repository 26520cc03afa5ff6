"""install -> uninstall -> install behaves like a fresh process, layer by layer (issue 27): what a
layer learns serving a runtime lives in that runtime (``Runtime.layer_state``) or is read from the
patch registry, never kept in the layer's module, so a new installation starts knowing nothing.
In-process, against a real service; the Dynamo layer's test is tests/test_dynamo_cache.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.torch
pytest_plugins = ["live"]

KERNEL_KEY = "A" * 52  # a kernel key the service does not hold


@pytest.fixture
def install(live_service: Any, tmp_path: Path) -> Iterator[Any]:
    """``kcache.install()`` against the live service (read-only unless asked), uninstalled at the end."""
    import kcache

    def install_(**options: Any) -> Any:
        from kcache.current import get_runtime

        assert kcache.install(url=live_service.url, local_dir=str(tmp_path / "local"), **{"mode": "readonly", **options})
        return get_runtime()

    try:
        yield install_
    finally:
        kcache.uninstall()


def test_inductors_remote_caches_serve_what_the_new_install_selects(install: Any) -> None:
    """The layers served are read from Inductor's classes, not remembered beside them: after
    ``uninstall()`` none is, and the next ``install()`` serves what it selects; a predicate module
    that loads after it (as in a fresh process) is left alone for a layer it does not serve."""
    import kcache
    from kcache.layers.inductor import remote_caches
    from torch._functorch._aot_autograd import autograd_cache
    from torch._inductor import remote_cache

    install(layers="fx-graph,aot-autograd")
    assert remote_caches.served_layers() == ["aot-autograd", "fx-graph"]
    kcache.uninstall()
    assert remote_caches.served_layers() == []
    install(layers="autotune")
    assert remote_caches.served_layers() == ["autotune"]
    assert remote_cache.RemoteFxGraphCache.__dict__.get("backend_override_cls") is None
    predicate = autograd_cache.should_use_remote_autograd_cache
    remote_caches._wrap_predicate("aot-autograd", autograd_cache)  # the module loading now
    assert autograd_cache.should_use_remote_autograd_cache is predicate


def test_a_compile_begun_under_the_last_install_is_credited_no_time(install: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """TritonBundler's compile timing is the runtime's: a graph whose ``begin_compile`` ran under
    the last installation is collected under the new one with no start time (a fresh process
    never saw it begin). Failed before: the module's thread-local kept the old start."""
    import kcache
    from kcache.layers.inductor import triton_bundler
    from torch._inductor.triton_bundler import TritonBundler

    collected: list[tuple[Any, float | None]] = []
    monkeypatch.setattr(triton_bundler, "_upload_collected", lambda rt, bundle, started: collected.append((rt, started)))
    first = install()
    TritonBundler.begin_compile()
    TritonBundler.collect()
    assert collected == [(first, collected[0][1])] and collected[0][1] is not None  # timed under one runtime
    TritonBundler.begin_compile()
    kcache.uninstall()
    second = install()
    assert second is not first
    TritonBundler.collect()
    assert collected[-1] == (second, None)


def test_the_canary_samples_as_a_fresh_process_after_a_reinstall(install: Any) -> None:
    """What the canary sampled and holds under audit is the runtime's: after ``uninstall()`` and
    ``install()``, or an ``install()`` with other options, a key is sampled again. The second
    failed before (the module's sets were cleared only by ``uninstall()``)."""
    import kcache
    from kcache.layers import key_canary as canary

    rt = install(canary=1)
    assert canary.kernel_audit(rt, KERNEL_KEY) is False  # sampled; the service has no such kernel
    assert canary.kernel_audit(rt, KERNEL_KEY) is None  # once per key
    kcache.uninstall()
    rt = install(canary=1)
    assert canary.kernel_audit(rt, KERNEL_KEY) is False
    other = install(canary=1, namespace="other")  # another install() replaces the runtime
    assert other is not rt
    assert canary.kernel_audit(other, KERNEL_KEY) is False
    assert canary.kernel_audit(other, KERNEL_KEY) is None


def test_a_vllm_model_missed_under_the_last_install_is_not_credited_its_compile_time(install: Any, tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The vllm layer's misses (when vLLM began compiling a model kcache lacked), installs and
    uploads are the runtime's: a model missed under the last installation and saved under the
    new one is uploaded without a compile time (a fresh process never saw the compile begin).
    Failed before: the module's dict kept the old miss and credited its start."""
    import kcache
    from kcache.layers import vllm_compile_cache as vllm_cache

    uploads: list[tuple[Any, str, float | None]] = []
    monkeypatch.setattr(vllm_cache, "_upload", lambda rt, entry, key, compile_s: uploads.append((rt, key, compile_s)))
    model = tmp_path / "vllm" / "torch_compile_cache" / vllm_cache.AOT_DIR / ("ab" * 32) / "rank_0_0" / vllm_cache.MODEL_FILE
    first = install(layers="vllm", mode="readwrite")
    assert vllm_cache._lookup(object(), str(model)) is not None  # a miss: vLLM compiles it
    vllm_cache._upload_soon(str(model))  # vLLM saved it: uploaded with the compile's time
    assert len(uploads) == 1 and uploads[0][0] is first and uploads[0][2] is not None
    assert vllm_cache._lookup(object(), str(model)) is not None
    kcache.uninstall()
    second = install(layers="vllm", mode="readwrite")
    vllm_cache._upload_soon(str(model))
    assert uploads[-1][0] is second and uploads[-1][2] is None


def test_a_jit_library_is_known_only_to_the_runtime_that_wrote_it(install: Any, tmp_path: Path) -> None:
    """The jit layers' records (libraries and modules kcache wrote, deferred headers, builds in
    flight) are the runtime's (``Builds`` in ``Runtime.layer_state``). torch's extension JIT,
    driven through kcache's wrappers with stand-ins for torch's functions: runtime 1 builds and
    uploads a library; after ``uninstall()`` and ``install()``, runtime 2 is served it, and when
    it does not import runtime 2 takes it back and has ninja build it, counted in its own stats;
    runtime 1's record of nothing it wrote, and runtime 2's state, start empty."""
    import kcache
    from kcache.layers.jit import torch_extensions as extensions
    from kcache.layers.jit.layer import LAYER

    from kcache_testkit.pace import HANG_S

    build = tmp_path / "build"
    build.mkdir()
    (build / "ext.cpp").write_text("int f() { return 1; }\n")
    (build / "build.ninja").write_text("rule link\n  command = link $in -o $out\nbuild ext.so: link ext.cpp\ndefault ext.so\n")
    library = build / "ext.so"
    built = b"\x7fELF built by ninja"
    ninja_runs: list[str] = []
    importable = {"yes": True}

    def run_ninja(build_directory: str, *args: Any, **kwargs: Any) -> None:  # torch's _run_ninja_build
        ninja_runs.append(build_directory)
        library.write_bytes(built)

    def import_library(module_name: str, path: str, *args: Any, **kwargs: Any) -> str:  # torch's _import_module_from_library
        if not importable["yes"]:
            importable["yes"] = True  # the library ninja builds next imports
            raise ImportError("undefined symbol")
        return module_name

    ext = type("Ext", (), {"LIB_EXT": ".so"})
    run = extensions._wrap_run(run_ninja, ext)
    write = extensions._wrap_write(lambda name: run(str(build)))  # torch's _write_ninja_file_and_build_library
    load = extensions._wrap_import(import_library, ext)

    first = install(layers="jit", mode="readwrite")
    write("ext")
    assert ninja_runs == [str(build)] and load("ext", str(build)) == "ext"  # a miss: ninja built it
    assert first.uploader is not None and first.uploader.flush(HANG_S)
    assert first.layer_state(extensions.Builds).installed == {}
    kcache.uninstall()

    library.unlink()
    second = install(layers="jit")
    assert second.layer_state(extensions.Builds).installed == {}  # a fresh process's
    write("ext")
    assert ninja_runs == [str(build)] and library.read_bytes() == built  # served by kcache
    assert list(second.layer_state(extensions.Builds).installed) == [str(library)]
    importable["yes"] = False
    assert load("ext", str(build)) == "ext"  # taken back, built by ninja, imported
    assert ninja_runs == [str(build)] * 2 and second.layer_state(extensions.Builds).installed == {}
    counts = second.stats.snapshot()[LAYER]
    assert counts.hits == 1 and counts.error_kinds == {"refused": 1}, counts
    assert first.layer_state(extensions.Builds).installed == {}
