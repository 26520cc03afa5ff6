"""Wall-time bounds that hold on a loaded machine.

A test that bounds a wait ("the breaker-open call does not touch the network", "a stalled
backend answers 503 within its deadline") must not compare against a fixed number of seconds:
CI machines are shared and their speed varies tenfold. Instead it measures, in the same test, how
fast this machine is right now (:func:`probe_s`, a fixed piece of CPU work) and allows the
protocol's own time (deadlines, timeouts: fixed by configuration, not by the machine) plus a
multiple of that probe for the work around it.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable

_WORK = b"\x5a" * (512 << 10)


def _cpu_work() -> None:
    hashlib.sha256(_WORK).digest()
    sum(i * i for i in range(10_000))


def probe_s(work: Callable[[], object] = _cpu_work, runs: int = 5) -> float:
    """Median wall time of ``work`` right now (about 0.5 ms for the default work, idle)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bound(protocol_s: float, probes: float, reference_s: float | None = None) -> float:
    """``protocol_s`` (what configuration makes the operation wait) plus ``probes`` times the
    reference (by default :func:`probe_s` measured now)."""
    return protocol_s + probes * (probe_s() if reference_s is None else reference_s)


# A hang guard for a job a test waits on (a subprocess, a child interpreter): not a bound on how
# long the job may take. A job that takes 30 s idle took over 300 s at load 12 on 2 cores, so the
# guard sits far above any loaded run, under pytest-timeout's 1800 s (the suite's backstop).
HANG_S = 1500.0
