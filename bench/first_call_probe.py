"""What a node's main thread did during its first ``torch.compile`` call, besides the phases torch
times (issue 26: a fresh kcache node spent +0.3-0.6 s more than a copied-warm node in AOTAutograd's
trace of the same graph, with the same counters, where kcache's layers report milliseconds).

Separates the three ways a main thread's wall time grows without torch doing more work:

* **more CPU on the main thread** (``main_thread_cpu_s``): the interpreter did more, e.g. the
  garbage collector walking a larger heap (``gc_s``, ``gc_collections`` by generation);
* **waiting** (wall minus main-thread CPU): the GIL held by another thread of the process
  (``other_threads_cpu_s`` is the process's CPU minus the main thread's), or I/O;
* **no core to run on** (``main_thread_involuntary_switches``): other processes of the node
  (Inductor's compile sidecar importing, its pool workers) or of the machine (``loadavg``).

It also records whether Inductor's compile pool was ready when the call started and ended
(before it is, Inductor compiles in the main process).
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import threading
import time
from typing import Any

_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux only


def _switches() -> tuple[int, int]:
    if _THREAD is None:
        return 0, 0
    usage = resource.getrusage(_THREAD)
    return usage.ru_nvcsw, usage.ru_nivcsw


def _pool_ready() -> bool | None:
    """Inductor's ``use_process_pool`` answer without asking it (asking submits the probe job)."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    future = getattr(getattr(async_compile, "AsyncCompile", None), "_ready_future", None)
    return None if future is None else bool(future.done())


class FirstCallProbe:
    def __init__(self) -> None:
        self._gc_started = 0.0
        self.gc_s = 0.0
        self.collections = [0, 0, 0]

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # a background thread's collection is not the main thread's time
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_started
            self.collections[info["generation"]] += 1

    def start(self) -> None:
        self._pool_at_start = _pool_ready()
        self._threads = threading.active_count()
        self._objects = len(gc.get_objects())
        self._loadavg = os.getloadavg()[0]
        self._switches = _switches()
        self._wall, self._thread_cpu, self._process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        gc.callbacks.append(self._on_gc)

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._wall
        thread_cpu = time.thread_time() - self._thread_cpu
        process_cpu = time.process_time() - self._process_cpu
        gc.callbacks.remove(self._on_gc)
        voluntary, involuntary = (now - before for now, before in zip(_switches(), self._switches, strict=True))
        return {
            "wall_s": round(wall, 4),
            "main_thread_cpu_s": round(thread_cpu, 4),
            "other_threads_cpu_s": round(max(process_cpu - thread_cpu, 0.0), 4),
            "gc_s": round(self.gc_s, 4),
            "gc_collections": list(self.collections),
            "main_thread_voluntary_switches": voluntary,
            "main_thread_involuntary_switches": involuntary,
            "threads_at_start": self._threads,
            "gc_objects_at_start": self._objects,
            "loadavg_at_start": round(self._loadavg, 2),
            "compile_pool_ready": [self._pool_at_start, _pool_ready()],
        }
