"""The process's one kcache runtime, and the only way to it.

Every hook (bundler, remote caches, Triton's cache manager) calls :func:`get_runtime` on each
call, so ``kcache.install()`` with other options, ``uninstall()`` and a later ``install()`` take
effect everywhere at once. A runtime replaced or stopped is closed (uploads flushed, workload
published) and then reported (``KCACHE_STATS_FILE``, ``KCACHE_REPORT``, ``KCACHE_RUN_ID``); the
last one at interpreter exit.
"""

from __future__ import annotations

import atexit
import threading

from kcache.config import ClientConfig
from kcache.runtime import Runtime

_runtime: Runtime | None = None
_lock = threading.Lock()


def _report(rt: Runtime) -> None:
    from kcache.report import at_exit

    at_exit(rt.config, rt.stats, rt.service_known_dead())


def get_runtime() -> Runtime | None:
    return _runtime


def ensure_runtime(config: ClientConfig) -> Runtime:
    """The running runtime if it has this config (e.g. started early by the workload
    prefetcher), else a new one that replaces it. Atomic, so concurrent starters share one."""
    global _runtime
    with _lock:
        if _runtime is not None and _runtime.config == config:
            return _runtime
        if _runtime is not None:
            _runtime.close()
        _runtime = Runtime(config, on_close=_report)
        return _runtime


def stop_runtime() -> None:
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None


atexit.register(stop_runtime)
