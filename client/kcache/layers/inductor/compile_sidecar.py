"""kcache in Inductor's compile sidecar: activated in its pool workers, at their first compile job.

Inductor starts its compile sidecar (``torch/_inductor/compile_worker/__main__.py``) when a job
first compiles; the sidecar imports Inductor, which is where kcache activates in any process. But
the sidecar itself never compiles: it forks the pool workers that do, and kcache's activation there
(its client and layers: ~0.4-0.6 s of imports) only delayed the pool (Inductor compiles in the
job's own process until the pool answers its readiness probe) and the job's exit (which waits for
a sidecar still starting; +0.02-1.4 s per job on the H200s, issue 26). The workers do need kcache:
a Triton kernel they compile looks its autotune winners up through kcache's remote autotune
cache, whose switch comes in the kernel's own metadata.

So in the sidecar kcache only replaces ``SubprocMain.do_job``, the function each pool worker runs
every job through (the pool pickles it by name, and fork-started workers inherit the patched
class), and a worker activates kcache before its first job other than Inductor's readiness probe
(``AsyncCompile._get_ready``). A warm node whose kernels all come from the FX entry's bundle sends
the pool no job but the probe: kcache never loads in its compile processes at all.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kcache.host import patching
from kcache.host.after_import import call_after_import

SUBPROC_POOL = "torch._inductor.compile_worker.subproc_pool"
PATCH_GROUP = "compile-sidecar"
log = logging.getLogger("kcache")


def activate_at_first_job(activate: Callable[[], object]) -> None:
    """Called in the sidecar instead of ``activate``: the pool workers call it, each once, before
    their first job that is not the readiness probe."""
    call_after_import(SUBPROC_POOL, functools.partial(_patch_do_job, activate=activate))


def _patch_do_job(subproc_pool: ModuleType, activate: Callable[[], object]) -> None:
    main = getattr(subproc_pool, "SubprocMain", None)
    do_job = getattr(main, "do_job", None)
    if main is None or do_job is None:  # a torch without this pool: activate as everywhere else
        _activate_once(activate)
        return
    state: dict[str, Any] = {"activated": False, "probe": None}

    # Same name and module as torch's, so the pool's pickle of the job finds this one by name.
    @functools.wraps(do_job)
    def do_job_then_kcache(pickler: Any, *job: Any) -> Any:  # (data) or (job_id, data): 2.15
        if not state["activated"] and not _is_readiness_probe(pickler, job[-1], state):
            state["activated"] = True
            _activate_once(activate)
        return do_job(pickler, *job)

    patching.patch(PATCH_GROUP, main, "do_job", staticmethod(do_job_then_kcache))


def _is_readiness_probe(pickler: Any, data: bytes, state: dict[str, Any]) -> bool:
    """The job is Inductor's ``AsyncCompile._get_ready``, pickled as the job's pickler does (the
    same bytes: a function pickles as its name); compared without unpickling the job twice."""
    try:
        if state["probe"] is None:
            from torch._inductor.async_compile import AsyncCompile

            state["probe"] = pickler.dumps(AsyncCompile._get_ready)
        return bool(data == state["probe"])
    except Exception:  # a torch without the probe: every job activates, as before
        return False


def _activate_once(activate: Callable[[], object]) -> None:
    try:
        activate()
    except Exception:  # fail-open: the job runs without kcache
        log.warning("kcache: activation in Inductor's compile worker failed", exc_info=True)
