"""kcache.layers.inductor.coordesc_reuse: a warm start uses the coordinate-descent winner the autotune cache holds.

The cache entries are written and read by Inductor's own AutotuneCache (local ``.best_config``
files) and rechecked by torch's real ``CachingAutotuner.recheck_autotune_cache``. The CPU build
here is torch 2.13, which already keeps the mark; torch 2.11/2.12 (the GPU machines) do not, so
those tests run the wrapper over torch 2.11's recheck, quoted below line for line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
from kcache.layers.inductor import coordesc_reuse
from torch._inductor.runtime import triton_heuristics as th
from torch._inductor.runtime.autotune_cache import AutotuneCache
from torch._inductor.runtime.runtime_utils import triton_config_to_hashable
from triton import Config

pytestmark = pytest.mark.torch

META = {"coordinate_descent_tuning": True, "autotune_local_cache": True, "autotune_remote_cache": False}


def recheck_torch_2_11(self: Any, reload_kernel_from_src: Any) -> None:
    """torch 2.11.0 ``CachingAutotuner.recheck_autotune_cache``, verbatim but for module lookups
    (``th.``) and the dynamo_timed context, which needs no compile context here."""
    assert self.is_statically_launchable()

    configs = [result.config for result in self.compile_results]

    (cached_configs, _, autotune_cache_info) = th.check_autotune_cache(configs, self.filename, self.inductor_meta)
    self.autotune_cache_info = autotune_cache_info
    # I.e. there was an autotune cache hit
    if len(cached_configs) == 1 and len(configs) > 1:
        best_config = cached_configs[0]
        # Grab the best compiled config, if it's in the list of available ones
        best_config_hash = triton_config_to_hashable(best_config)

        for compile_result in self.compile_results:
            if triton_config_to_hashable(compile_result.config) == best_config_hash:
                self.compile_results = [compile_result]
                return

        # If the best config isn't in our list of compile results,
        # it's likely because it was found by coordesc after the cache
        # already saved
        if best_config.found_by_coordesc:
            if self.fn.fn is None:
                self.fn = reload_kernel_from_src().fn
            self.compile_results = [self._precompile_config(best_config)]


class _Fn:
    fn = object()  # the kernel is loaded: no reload from source needed


def _static_result(config: Config) -> Any:
    result = object.__new__(th.StaticTritonCompileResult)
    result.config = config
    return result


def _autotuner(tmp_path: Path, configs: list[Config]) -> Any:
    """A CachingAutotuner as a warm start loads it from a bundle: statically launchable results,
    no launchers yet. Only what recheck reads is set (its __init__ needs a GPU kernel)."""
    autotuner = object.__new__(th.CachingAutotuner)
    autotuner.filename = str(tmp_path / "cabcdefkernel.py")
    autotuner.inductor_meta = dict(META)
    autotuner.compile_results = [_static_result(c) for c in configs]
    autotuner.fn = _Fn()
    autotuner.compiled_now = []
    # torch 2.15's recheck asks the lazily computed ``_could_rblock_scale``, which reads
    # ``size_hints``, ``heuristic_type`` and ``device_props`` that __init__ sets on a real one;
    # a pointwise kernel never rescales its rblock. Older torches never read these.
    autotuner.size_hints = {"x": 1024}
    autotuner.heuristic_type = "pointwise"
    autotuner._could_rblock_scale = False

    def precompile_config(cfg: Config) -> Any:
        autotuner.compiled_now.append(cfg)
        return _static_result(cfg)

    autotuner._precompile_config = precompile_config
    return autotuner


def _cache_winner(autotuner: Any, configs: list[Config], winner: Config) -> None:
    """What the cold run's coordinate-descent tuning saved (Inductor's own save path)."""
    cache = AutotuneCache.create(autotuner.inductor_meta, autotuner.filename, th.hash_configs(configs))
    assert cache is not None
    cache.save(winner, 5_000_000, found_by_coordesc=True)


@contextlib.contextmanager
def _torch_2_11_recheck(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(th.CachingAutotuner, "recheck_autotune_cache", recheck_torch_2_11)
    yield


@pytest.fixture(autouse=True)
def _restore(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Depends on monkeypatch so it is torn down first: uninstall, then monkeypatch undoes the
    # 2.11 stand-in (the other order would leave the stand-in in place for later tests).
    yield
    coordesc_reuse.uninstall()


def _configs() -> list[Config]:
    return [Config({"XBLOCK": x}, num_warps=4, num_stages=1) for x in (64, 128, 256)]


def _tunes_again(autotuner: Any) -> bool:
    """``CachingAutotuner.run`` tunes unless its single config carries the mark."""
    assert len(autotuner.compile_results) == 1
    return not getattr(autotuner.compile_results[0].config, "found_by_coordesc", False)


def test_torch_2_11_alone_tunes_again_despite_the_cached_winner(tmp_path, monkeypatch) -> None:
    """The bug this module exists for: without kcache the cached winner is dropped."""
    configs = _configs()
    with _torch_2_11_recheck(monkeypatch):
        autotuner = _autotuner(tmp_path, configs)
        _cache_winner(autotuner, configs, configs[1])
        th.CachingAutotuner.recheck_autotune_cache(autotuner, None)
    assert autotuner.autotune_cache_info["autotune_cache_state"] == "hit"
    assert triton_config_to_hashable(autotuner.compile_results[0].config) == triton_config_to_hashable(configs[1])
    assert _tunes_again(autotuner)


def test_the_cached_winner_among_the_compiled_configs_is_used_without_tuning(tmp_path, monkeypatch) -> None:
    configs = _configs()
    with _torch_2_11_recheck(monkeypatch):
        assert coordesc_reuse.install()
        autotuner = _autotuner(tmp_path, configs)
        _cache_winner(autotuner, configs, configs[1])
        th.CachingAutotuner.recheck_autotune_cache(autotuner, None)
    assert triton_config_to_hashable(autotuner.compile_results[0].config) == triton_config_to_hashable(configs[1])
    assert not _tunes_again(autotuner)
    assert autotuner.compiled_now == []  # it was in the bundle: nothing compiled


def test_a_single_config_kernel_compiles_its_cached_winner_once(tmp_path, monkeypatch) -> None:
    only = Config({"XBLOCK": 64}, num_warps=4, num_stages=1)
    winner = Config({"XBLOCK": 512}, num_warps=8, num_stages=1)  # found by tuning, not in the bundle
    with _torch_2_11_recheck(monkeypatch):
        assert coordesc_reuse.install()
        autotuner = _autotuner(tmp_path, [only])
        _cache_winner(autotuner, [only], winner)
        th.CachingAutotuner.recheck_autotune_cache(autotuner, None)
    assert [triton_config_to_hashable(c) for c in autotuner.compiled_now] == [triton_config_to_hashable(winner)]
    assert triton_config_to_hashable(autotuner.compile_results[0].config) == triton_config_to_hashable(winner)
    assert not _tunes_again(autotuner)


def test_a_single_config_kernel_whose_winner_is_its_config_is_marked(tmp_path, monkeypatch) -> None:
    only = Config({"XBLOCK": 64}, num_warps=4, num_stages=1)
    with _torch_2_11_recheck(monkeypatch):
        assert coordesc_reuse.install()
        autotuner = _autotuner(tmp_path, [only])
        _cache_winner(autotuner, [only], Config({"XBLOCK": 64}, num_warps=4, num_stages=1))
        th.CachingAutotuner.recheck_autotune_cache(autotuner, None)
    assert autotuner.compiled_now == [] and not _tunes_again(autotuner)


def test_without_a_cached_winner_the_kernel_is_tuned_as_before(tmp_path, monkeypatch) -> None:
    configs = _configs()
    with _torch_2_11_recheck(monkeypatch):
        assert coordesc_reuse.install()
        autotuner = _autotuner(tmp_path, configs)
        th.CachingAutotuner.recheck_autotune_cache(autotuner, None)
    assert autotuner.autotune_cache_info["autotune_cache_state"] == "miss"
    assert len(autotuner.compile_results) == 3 and autotuner.compiled_now == []
    assert not any(getattr(r.config, "found_by_coordesc", False) for r in autotuner.compile_results)


def test_a_winner_saved_without_coordinate_descent_is_not_marked(tmp_path, monkeypatch) -> None:
    """Plain autotuning winners (no coordesc mark) must still be tuned by coordinate descent."""
    configs = _configs()
    with _torch_2_11_recheck(monkeypatch):
        assert coordesc_reuse.install()
        autotuner = _autotuner(tmp_path, configs)
        cache = AutotuneCache.create(autotuner.inductor_meta, autotuner.filename, th.hash_configs(configs))
        assert cache is not None
        cache.save(configs[2], 5_000_000, found_by_coordesc=False)
        th.CachingAutotuner.recheck_autotune_cache(autotuner, None)
    assert _tunes_again(autotuner)


def test_on_this_torch_the_real_recheck_and_the_wrapper_agree(tmp_path) -> None:
    """Over torch's own recheck (2.13 keeps the mark itself) the wrapper changes nothing."""
    configs = _configs()
    assert coordesc_reuse.install()
    autotuner = _autotuner(tmp_path, configs)
    _cache_winner(autotuner, configs, configs[2])
    th.CachingAutotuner.recheck_autotune_cache(autotuner, None)
    assert triton_config_to_hashable(autotuner.compile_results[0].config) == triton_config_to_hashable(configs[2])
    assert not _tunes_again(autotuner) and autotuner.compiled_now == []


def test_switched_off_and_uninstall_restore_inductor(monkeypatch) -> None:
    original_recheck, original_check = th.CachingAutotuner.recheck_autotune_cache, th.check_autotune_cache
    from kcache.config import ClientConfig

    monkeypatch.setenv("KCACHE_COORDESC_REUSE", "0")
    assert not coordesc_reuse.install(ClientConfig.from_env().coordesc_reuse)
    assert th.CachingAutotuner.recheck_autotune_cache is original_recheck
    monkeypatch.delenv("KCACHE_COORDESC_REUSE")
    assert coordesc_reuse.install(ClientConfig.from_env().coordesc_reuse)
    assert th.CachingAutotuner.recheck_autotune_cache is not original_recheck
    coordesc_reuse.uninstall()
    assert th.CachingAutotuner.recheck_autotune_cache is original_recheck and th.check_autotune_cache is original_check


def test_kcache_install_switches_it_on_and_uninstall_off(monkeypatch) -> None:
    import kcache

    original = th.CachingAutotuner.recheck_autotune_cache
    assert kcache.install(url="http://127.0.0.1:9")  # nothing listens there: the hooks go in regardless
    try:
        assert th.CachingAutotuner.recheck_autotune_cache.__module__ == "kcache.layers.inductor.coordesc_reuse"
    finally:
        kcache.uninstall()
    assert th.CachingAutotuner.recheck_autotune_cache is original
