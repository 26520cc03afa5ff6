"""kcache in Inductor's compile sidecar (kcache.layers.inductor.compile_sidecar), in a real job's process tree:
the sidecar Inductor starts never loads kcache's client (it only delays the pool and the job's
exit there), its pool workers load it at their first compile job, not for the readiness probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kcache_testkit.pace import HANG_S
from kcache_testkit.service import clean_env, with_testkit

pytest_plugins = ["live"]
pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.torch]

# A job as Inductor runs its pool: the sidecar starts, answers the readiness probe, then gets a
# job. Which of its processes hold kcache's client is read from their memory maps
# (pydantic-core's library: torch never loads it, kcache's client does).
JOB = r"""
import json, os, sys
import torch
from torch._inductor import config
from torch._inductor.async_compile import AsyncCompile
import worker_jobs

config.compile_threads = 2

def tree(pid):
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == pid]
    return [pid] + [q for c in children for q in tree(c)]

def _ppid(pid):
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None

def with_client(pids):
    return sorted(p for p in pids if "_pydantic_core" in open(f"/proc/{p}/maps").read())

pool = AsyncCompile.process_pool()
AsyncCompile.wait_pool_ready()  # the probe ran in one of the forked workers
sidecar = pool.process.pid
ready = {"processes": len(tree(sidecar)), "with_client": with_client(tree(sidecar))}
worker = pool.submit(worker_jobs.kcache_in_this_worker).result()
print(json.dumps({"sidecar": sidecar, "at_ready": ready, "worker": worker,
                  "after_job": with_client(tree(sidecar)), "job_process_has_client": bool(with_client([os.getpid()]))}))
"""

WORKER_JOBS = """
import os

def kcache_in_this_worker():
    from kcache.current import get_runtime
    return {"pid": os.getpid(), "parent": os.getppid(), "runtime": get_runtime() is not None}
"""


def test_the_sidecar_never_loads_kcache_and_a_worker_loads_it_for_its_first_job(live_service, tmp_path: Path) -> None:
    (tmp_path / "worker_jobs.py").write_text(WORKER_JOBS)
    home = tmp_path / "home"
    home.mkdir()
    # Inductor itself in the job (an import of Inductor activates kcache there).
    env = with_testkit(clean_env(KCACHE_URL=live_service.url, HOME=str(home), TMPDIR=str(tmp_path), PYTHONPATH=str(tmp_path)))
    env = {k: v for k, v in env.items() if not k.startswith(("TRITON_", "TORCHINDUCTOR_"))}
    out = subprocess.run([sys.executable, "-c", "import torch._inductor.compile_fx\n" + JOB], env=env,
                         capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])

    assert seen["job_process_has_client"]  # kcache is active in the job itself, as always
    assert seen["at_ready"]["processes"] >= 2  # the sidecar and the workers it forked
    # Before: the sidecar activated kcache when it imported Inductor, its workers inherited it.
    assert seen["at_ready"]["with_client"] == [], "the compile sidecar or a probe-only worker loaded kcache's client"
    worker = seen["worker"]
    assert worker["runtime"] and worker["parent"] == seen["sidecar"]
    assert seen["after_job"] == [worker["pid"]]  # that worker only; the sidecar still has none
    assert "Traceback" not in out.stderr and "kcache:" not in out.stderr, out.stderr[-3000:]


def test_a_spawned_or_forked_pool_worker_is_no_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    from kcache.host.process_roles import in_inductor_compile_sidecar

    monkeypatch.setattr(sys, "argv", [os.path.join("torch", "_inductor", "compile_worker", "__main__.py"), "--workers=2"])
    assert in_inductor_compile_sidecar()  # started by subprocess: no multiprocessing parent
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert not in_inductor_compile_sidecar()  # a pool worker (its argv is the sidecar's): activates itself
