"""Which process of a process tree prefetches a workload (import-light: used at start-up).

Inductor's compile workers, DataLoader workers and torchrun's ranks inherit the environment, so
each would otherwise start its own prefetcher and download the same workload N times into the
same dirs. The first process claims the job by writing its pid into the environment; processes it
starts inherit that claim and leave prefetching to it.
"""

from __future__ import annotations

import os

ENV = "KCACHE_PREFETCH_PID"


def claim_prefetch() -> bool:
    owner = os.environ.get(ENV)
    if owner and owner != str(os.getpid()):
        return False
    os.environ[ENV] = str(os.getpid())
    return True
