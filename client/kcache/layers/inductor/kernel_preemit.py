"""Pre-emit: a fresh node's prefetched kernels written into Inductor's Triton dir before it asks.

A warm start through the FX-graph cache ends in ``TritonBundler.read_and_emit``, which writes
every kernel dir of the graph from the FX entry (kcache's hook emits them: 0.03-0.075 s of an
H200 node's first call, ``bench/results/gpu/phases_h3.md``), where a node whose cache dirs were
copied by hand finds them on disk. The workload prefetch holds the same kernels as packs in the
local tier long before the first compile asks, so once the bundler hooks are in (Inductor is
imported: at ``torch.compile`` in a job, after it set its environment) a kcache thread writes
them into the dir Inductor will use, and the hook finds each dir whole (``looks_emitted``).

**Which dir.** Inductor's ``triton_cache_dir(device)``, computed without its side effect
(:func:`kcache.store.kernel_dirs.inductor_triton_dir`). The device is the one the graph's kernels
were compiled for, which arrives with the graph: kcache takes ``LOCAL_RANK`` (torchrun's
convention, rank r on ``cuda:r``), else 0. A wrong guess costs only the writes: the hook then
emits into the right dir as before. Only where ``TRITON_CACHE_DIR`` is unset (the user's default
environment): set, it is Triton's own dir too, where kcache's cache manager serves (and counts)
each kernel Triton asks for. Not with entry signing configured: the hook takes a whole dir it
finds by its files' sizes, and a kernel pack is not signed, so a pre-emitted dir would stand in
for the kernels of a signed FX-graph entry.

**Never ahead of the job.** The target check (a kernel for another GPU is never written) asks
torch for the GPU, which initializes CUDA; this thread never does that first: it waits until
the job has initialized CUDA itself (``KCACHE_GPU_ARCH`` answers without torch). Nothing is
counted as served or used here: a kernel is used when the hook finds it, as on a copied node.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kcache_schemas import PackError, wire

from kcache.config import gpu_arch_override
from kcache.exceptions import InvalidPack
from kcache.host.after_import import KCACHE_THREAD_PREFIX, imported
from kcache.host.failopen import guard
from kcache.runtime import Runtime
from kcache.store.emitter import EmitOutcome, emit_pack
from kcache.store.kernel_dirs import inductor_triton_dir
from kcache.transport.workload import shutting_down

KERNEL_LAYER = wire.CacheLayer.KERNEL.value
# Writes are mostly mkdir/write/rename system calls, which release the GIL (as the hook's emit).
_THREADS = 8
# How often the thread looks again whether the job initialized CUDA.
_CUDA_POLL_S = 0.05


@dataclass
class PreEmit:
    """One runtime's pre-emit (:meth:`Runtime.layer_state`): started once, joined at close."""

    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    cache_dir: Path | None = None
    emitted: int = 0  # kernel dirs written (already there: not counted)
    seconds: float = 0.0


def device_guess() -> int | None:
    """The device index Inductor will most likely compile for: ``LOCAL_RANK``'s, else 0."""
    raw = os.environ.get("LOCAL_RANK", "0")
    return int(raw) if raw.isdigit() else None


def start(rt: Runtime) -> None:
    """Start this runtime's pre-emit once, where it can help: a workload is being prefetched."""
    if rt.prefetcher is None or rt.signing is not None or os.environ.get("TRITON_CACHE_DIR") is not None:
        return
    state = rt.layer_state(PreEmit)
    if state.thread is not None:
        return
    state.thread = threading.Thread(target=_run, args=(rt, state), name=KCACHE_THREAD_PREFIX + "pre-emit", daemon=True)
    rt.at_close("finish pre-emitting kernels", functools.partial(_finish, state, rt.config.flush_timeout_s))
    state.thread.start()


def _finish(state: PreEmit, timeout_s: float) -> None:
    """At close: stop starting kernels and wait for those being written (a dir is written whole
    or not at all, so this only keeps the exit from leaving staging dirs behind)."""
    state.stop.set()
    if state.thread is not None:
        state.thread.join(timeout_s)


def _cuda_ready(stop: threading.Event, wait_s: float) -> bool:
    """Whether the GPU can be asked about without initializing CUDA: the job did it already."""
    if gpu_arch_override():
        return True
    deadline = time.monotonic() + wait_s
    while not stop.is_set():
        cuda = getattr(imported("torch"), "cuda", None)
        if cuda is not None and cuda.is_initialized():
            return True
        if time.monotonic() >= deadline:
            return False
        stop.wait(_CUDA_POLL_S)
    return False


def _run(rt: Runtime, state: PreEmit) -> None:
    with guard("could not pre-emit prefetched kernels; Inductor's bundles emit them as before"):
        prefetcher = rt.prefetcher
        device = device_guess()
        if prefetcher is None or device is None:
            return
        deadline = time.monotonic() + rt.config.prefetch_wait_s
        while not prefetcher.done.wait(_CUDA_POLL_S):  # an exit meanwhile stops the wait
            if state.stop.is_set() or time.monotonic() >= deadline:
                return
        view = prefetcher.view
        if view is None or not view.kernels or not _cuda_ready(state.stop, rt.config.prefetch_wait_s):
            return
        cache_dir = inductor_triton_dir(device)
        if cache_dir is None:
            return
        state.cache_dir = cache_dir
        t0 = time.perf_counter()

        def emit(key: str) -> bool:
            # At exit Python joins this pool's workers before kcache's close runs: skip what is left.
            if state.stop.is_set() or shutting_down() or (KERNEL_LAYER, key) in rt.quarantined:
                return False
            pack = rt.local.get(KERNEL_LAYER, key)
            if pack is None:
                return False
            try:  # verified as any pack from the service; a bad one is the hook's to refuse
                return emit_pack(cache_dir, pack, expected_key=key, check_target=rt.config.check_target) is EmitOutcome.EMITTED
            except (PackError, InvalidPack, OSError, ValueError):
                return False

        if state.stop.is_set() or shutting_down():
            return  # the job is exiting: nothing left to speed up
        with ThreadPoolExecutor(_THREADS, thread_name_prefix=KCACHE_THREAD_PREFIX + "pre-emit") as pool:
            state.emitted = sum(pool.map(emit, view.kernels))
        state.seconds = time.perf_counter() - t0
