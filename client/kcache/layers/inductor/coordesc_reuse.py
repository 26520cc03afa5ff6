"""Reuse cached coordinate-descent results on a warm start (torch 2.11; fixed in 2.13).

With ``coordinate_descent_tuning`` (on in ``max-autotune`` modes) Inductor tunes each pointwise
and reduction kernel at its first run and saves the winner to the autotune cache, marked
``found_by_coordesc``. A warm start loads those kernels as static autotuners and rechecks the
autotune cache (``CachingAutotuner.recheck_autotune_cache``). In torch 2.11 (2.12 not checked) that recheck
drops the mark when the winner is one of the configs already compiled, and ignores the cache
altogether for single-config kernels, so ``run()`` tunes the kernel again: a few seconds of
benchmarking and compiling new configs on every start, local warm starts included (GPT-2
max-autotune on an H100: 1.4-7.6 s of a 4-10 s first call, 4-7 kernels, 9-33 fresh compiles). torch 2.13 keeps the mark
(``compile_result.config.found_by_coordesc = found_by_coordesc``); we do the same after the
original method, so the winner the cache holds is used without tuning again.

We wrap the methods and call the originals (no torch code copied): ``check_autotune_cache``
only records what it returned while a recheck runs. Where Inductor already kept the mark this
does nothing. ``KCACHE_COORDESC_REUSE=0`` turns it off.
"""

from __future__ import annotations

import contextvars
from types import ModuleType
from typing import Any

from kcache.config import ClientConfig
from kcache.host import patching
from kcache.host.failopen import guard

PATCHES = "coordesc-reuse"
_seen: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("kcache_coordesc_seen", default=None)


def _mark_cached_winner(autotuner: Any, best: Any, reload_kernel_from_src: Any) -> None:
    """Make ``best`` (a cached coordinate-descent winner) the autotuner's only config, marked."""
    if len(autotuner.compile_results) == 1 and getattr(autotuner.compile_results[0].config, "found_by_coordesc", False):
        return  # Inductor kept the mark itself (torch >= 2.13, or the winner was compiled just now)
    from torch._inductor.runtime.runtime_utils import triton_config_to_hashable

    wanted = triton_config_to_hashable(best)
    for result in autotuner.compile_results:
        if triton_config_to_hashable(result.config) == wanted:
            result.config.found_by_coordesc = True
            autotuner.compile_results = [result]
            return
    # A single-config kernel whose cached winner was never compiled into the bundle: compile it
    # now, as Inductor does for multi-config kernels (one compile instead of a whole tuning run).
    from torch._dynamo.utils import dynamo_timed

    with dynamo_timed("CachingAutotuner.slow_precompile_config"):
        if autotuner.fn.fn is None:
            autotuner.fn = reload_kernel_from_src().fn
        autotuner.compile_results = [autotuner._precompile_config(best)]


def install(enabled: bool = True) -> bool:
    """Wrap Inductor's recheck; False (and nothing changed) where this torch lacks the pieces or
    ``enabled`` is False (``KCACHE_COORDESC_REUSE=0``)."""
    if patching.is_patched(PATCHES) or not enabled:
        return patching.is_patched(PATCHES)
    from torch._inductor.runtime import triton_heuristics as th

    autotuner_cls: Any = getattr(th, "CachingAutotuner", None)
    recheck = getattr(autotuner_cls, "recheck_autotune_cache", None)
    check = getattr(th, "check_autotune_cache", None)
    if recheck is None or check is None:
        return False

    def check_autotune_cache(*args: Any, **kwargs: Any) -> Any:
        result = check(*args, **kwargs)
        with guard("coordinate-descent reuse could not read the autotune cache's answer"):
            seen = _seen.get()
            if seen is not None:
                seen.append(result[0])
        return result

    def recheck_autotune_cache(self: Any, *args: Any, **kwargs: Any) -> None:
        seen: list[Any] = []
        token = _seen.set(seen)
        try:
            recheck(self, *args, **kwargs)
        finally:
            _seen.reset(token)
        with guard("coordinate-descent reuse failed; Inductor tunes this kernel as usual"):
            reload_kernel_from_src = args[0] if args else kwargs.get("reload_kernel_from_src")
            if not seen or not self.inductor_meta.get("coordinate_descent_tuning"):
                return
            cached = seen[-1]  # [best] on an autotune cache hit, else the configs it was given
            if len(cached) == 1 and getattr(cached[0], "found_by_coordesc", False):
                _mark_cached_winner(self, cached[0], reload_kernel_from_src)

    patching.patch(PATCHES, th, "check_autotune_cache", check_autotune_cache)
    patching.patch(PATCHES, autotuner_cls, "recheck_autotune_cache", recheck_autotune_cache)
    return True


def uninstall() -> None:
    patching.restore(PATCHES)


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "coordesc-reuse"
STORES: tuple[str, ...] = ()  # fixes how Inductor reads the autotune layer's winners


def selected(config: ClientConfig) -> bool:
    return config.coordesc_reuse  # KCACHE_COORDESC_REUSE


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install()
