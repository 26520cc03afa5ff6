"""What kind of process this is, for decisions made at start-up (import-light: os and sys only).

* Which process of a tree prefetches a workload: Inductor's compile workers, DataLoader workers
  and torchrun's ranks inherit the environment, so each would otherwise start its own prefetcher
  and download the same workload N times into the same dirs. The first process claims the job by
  writing its pid into the environment; processes it starts leave prefetching to it. Processes
  of a node that do not descend from one another (SLURM ``srun``, a container per rank) are
  kept to one download by the local tier's claim instead (:mod:`kcache.transport.workload`).
* Whether this is one of Inductor's compile workers, which Inductor terminates without running
  exit handlers: there, uploads must not wait in a background queue.
* Whether this is Inductor's compile sidecar itself, which never compiles: kcache activates in
  its pool workers instead (:mod:`kcache.layers.inductor.compile_sidecar`).
"""

from __future__ import annotations

import os
import sys

PREFETCH_OWNER_ENV = "KCACHE_PREFETCH_PID"


def claim_prefetch() -> bool:
    owner = os.environ.get(PREFETCH_OWNER_ENV)
    if owner and owner != str(os.getpid()):
        return False
    os.environ[PREFETCH_OWNER_ENV] = str(os.getpid())
    return True


def in_inductor_compile_worker() -> bool:
    """Inductor's compile sidecar runs torch/_inductor/compile_worker/__main__.py, and its pool
    workers inherit that argv (multiprocessing hands the parent's argv to spawned children)."""
    argv0 = sys.argv[0] if getattr(sys, "argv", None) else ""
    return "compile_worker" in argv0.replace("\\", "/").split("/")


def in_inductor_compile_sidecar() -> bool:
    """The sidecar is started by ``subprocess`` (no multiprocessing parent); its pool workers,
    forked or spawned by multiprocessing, have one."""
    if not in_inductor_compile_worker():
        return False
    import multiprocessing

    return multiprocessing.parent_process() is None
