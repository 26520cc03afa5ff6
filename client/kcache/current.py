"""The process's one kcache runtime, and the only way to it.

Every hook (bundler, remote caches, Triton's cache manager) calls :func:`get_runtime` on each
call, so ``kcache.install()`` with other options, ``uninstall()`` and a later ``install()`` take
effect everywhere at once. A runtime replaced or stopped is closed (uploads flushed, workload
published) and then reported (``KCACHE_STATS_FILE``, ``KCACHE_REPORT``, ``KCACHE_RUN_ID``); the
last one at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from kcache.config import ClientConfig
from kcache.runtime import Runtime

_runtime: Runtime | None = None
_lock = threading.Lock()
# A forked child's runtime-to-be: made like the one its parent ran (see _after_fork_in_child).
_forked_from: Runtime | None = None


def _report(rt: Runtime) -> None:
    from kcache.reporting.report import at_exit

    at_exit(rt.config, rt.stats, rt.service_known_dead())


def get_runtime() -> Runtime | None:
    forked = _forked_from
    if _runtime is None and forked is not None:
        return ensure_runtime(forked.config)
    return _runtime


def _after_fork_in_child() -> None:
    """A forked child (vLLM's engine core and workers where CUDA is not initialised yet, DataLoader
    workers) inherits its parent's runtime object but none of its threads (the uploader, the
    prefetcher: a wait for a prefetch would last ``KCACHE_PREFETCH_WAIT_S``), and would share the
    parent's HTTP connections. The child starts its own runtime, with the same config, at its
    first use (its layers' close steps too); the parent's uploads, stats and workload stay the
    parent's."""
    global _runtime, _lock, _forked_from
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork
    if _runtime is not None:
        _forked_from, _runtime = _runtime, None


def ensure_runtime(config: ClientConfig) -> Runtime:
    """The running runtime if it has this config (e.g. started early by the workload
    prefetcher), else a new one that replaces it. Atomic, so concurrent starters share one."""
    global _runtime, _forked_from
    with _lock:
        forked, _forked_from = _forked_from, None
        if _runtime is not None and _runtime.config == config:
            return _runtime
        previous = _runtime
        if previous is not None:
            previous.close()
        _runtime = Runtime(config, on_close=_report)
        # The installed layers stay installed: their hand-overs run at the new runtime's close.
        carried = previous if previous is not None else forked
        if carried is not None:
            _runtime.adopt_close_steps(carried)
        if forked is not None:
            _close_with_multiprocessing()
        return _runtime


def _close_with_multiprocessing() -> None:
    """A process multiprocessing forked ends with ``os._exit``: no atexit. Its exit function runs
    multiprocessing's finalizers, so the child's runtime is closed there (uploads flushed, stats
    written, workload published)."""
    util = sys.modules.get("multiprocessing.util")
    finalize = getattr(util, "Finalize", None)
    if callable(finalize):
        finalize(None, stop_runtime, exitpriority=0)


def stop_runtime() -> None:
    global _runtime, _forked_from
    with _lock:
        _forked_from = None
        if _runtime is not None:
            _runtime.close()
        _runtime = None


atexit.register(stop_runtime)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
