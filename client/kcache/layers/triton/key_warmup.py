"""Triton's own key, hashed ahead: ``triton_key()`` ready before a GPU job's first compile asks.

Every process that compiles or loads a Triton kernel needs Triton's key first: a sha256 of
Triton's compiler, backend and language sources and of ``libtriton.so`` (~500 MB). On an H200
node it was 0.39-0.42 s of the first ``torch.compile`` call, warm or cold, kcache or copied
(``bench/results/gpu/h200/profiles_h4c``: ``triton_key`` under Inductor's
``inductor_meta_from_config``). Triton keeps it per process (``functools.lru_cache``), and
hashlib lets go of the GIL while it hashes, so a kcache thread that computes it while the job is
still tracing its model takes nothing from the job's own thread (measured on these machines: a
pure-Python loop on the main thread ran 0.182 s alone and 0.183 s beside the hashing). When the
job asks, the key is there. Torch does the same before it forks its compile workers
(``async_compile.pre_fork_setup``), on the job's thread.

**Only in a GPU job**, once it initialized CUDA itself (:mod:`kcache.host.job_cuda`), or where
``KCACHE_GPU_ARCH`` names the host's GPU: a CPU job never needs the key. **Never importing anything**: ``pkgutil.walk_packages`` inside
``triton_key`` imports each package it walks, and an import on this thread beside the job's own
could meet it in the import lock (whose deadlock check raises in one of the two threads); so the
key is computed only when Triton, the module that defines it and every package it walks are
imported already (it waits for the job to import them, as long as for the job's CUDA). Otherwise,
or when the job computed it first, nothing is done; the outcome is
kept in :class:`KeyWarmup` (the GPU bench records it).

Not joined at exit: the hash holds no file or lock of the job's, and an exit while it runs (a job
that ends before its first compile) must not wait for it.
"""

from __future__ import annotations

import os
import pkgutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kcache.config import gpu_arch_override
from kcache.host.after_import import KCACHE_THREAD_PREFIX, imported
from kcache.host.failopen import guard
from kcache.host.job_cuda import POLL_S, wait_for_job_cuda
from kcache.runtime import Runtime

# Where Triton defines ``triton_key``, newest first: torch's ``triton_compat`` looks in the same
# order, so this is the function object (and the cache) torch calls.
KEY_MODULES = ("triton.runtime.cache", "triton.compiler.compiler")
# The dirs ``triton_key`` walks, in any Triton from 3.0 to 3.9 (a superset is only stricter).
WALKED = ("compiler", "backends", "language")


@dataclass
class KeyWarmup:
    """One runtime's warm-up (:meth:`Runtime.layer_state`): started once."""

    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    outcome: str = "waiting"  # hashed | already | not a GPU job | triton not imported | stopped
    seconds: float = 0.0


def start(rt: Runtime) -> None:
    """Start this runtime's warm-up once."""
    state = rt.layer_state(KeyWarmup)
    if state.thread is not None:
        return
    state.thread = threading.Thread(target=_run, args=(rt, state), name=KCACHE_THREAD_PREFIX + "triton-key", daemon=True)
    rt.at_close("stop hashing Triton's key ahead", state.stop.set)
    state.thread.start()


def triton_key_function() -> Callable[[], str] | None:
    """Triton's cached ``triton_key`` where it and everything it would import are imported."""
    triton = imported("triton")
    triton_file = getattr(triton, "__file__", None)
    if not triton_file or imported("pkgutil") is None:
        return None
    for name in KEY_MODULES:
        function = getattr(imported(name), "triton_key", None)
        if function is not None and hasattr(function, "cache_info"):
            break
    else:
        return None
    root = os.path.dirname(triton_file)
    if not all(imported(package) for sub in WALKED for package in _packages(os.path.join(root, sub), f"triton.{sub}.")):
        return None
    return function  # type: ignore[no-any-return]


def _packages(path: str, prefix: str) -> Iterator[str]:
    """Every package under ``path`` by its module name, found on disk (``iter_modules`` imports
    nothing): the ones ``walk_packages`` would import."""
    for info in pkgutil.iter_modules([path], prefix):
        if info.ispkg:
            yield info.name
            yield from _packages(os.path.join(path, info.name.rsplit(".", 1)[1]), info.name + ".")


def _run(rt: Runtime, state: KeyWarmup) -> None:
    with guard("could not hash Triton's key ahead; the job hashes it when it first compiles"):
        if not (gpu_arch_override() or wait_for_job_cuda(state.stop, rt.config.prefetch_wait_s)):
            state.outcome = "stopped" if state.stop.is_set() else "not a GPU job"
            return
        deadline = time.monotonic() + rt.config.prefetch_wait_s
        while (function := triton_key_function()) is None:  # the job imports Triton in its own time
            if time.monotonic() >= deadline or state.stop.wait(POLL_S):
                state.outcome = "stopped" if state.stop.is_set() else "triton not imported"
                return
        if function.cache_info().currsize:  # type: ignore[attr-defined]
            state.outcome = "already"
            return
        if state.stop.is_set() or sys.is_finalizing():
            state.outcome = "stopped"
            return
        t0 = time.perf_counter()
        function()
        state.seconds, state.outcome = time.perf_counter() - t0, "hashed"
