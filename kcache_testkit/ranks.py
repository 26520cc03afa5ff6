"""One node's ranks of a multi-rank job (``ddp_job.py``), started the two ways users start them.

* ``torchrun``: ``python -m torch.distributed.run --nproc-per-node N`` (what the ``torchrun``
  script runs): one agent process, the ranks its children. They inherit the agent's environment,
  so the agent (kcache's ``.pth`` hook runs in it too) is the node's prefetcher.
* ``independent``: N plain interpreters, each with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
  ``LOCAL_WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set by hand, in a session of its own, and
  nothing else in common: no kcache-aware parent hands anything down (SLURM ``srun``, a container
  per rank). ``OMP_NUM_THREADS=1`` as torchrun sets it for N > 1 (unless set), so the two ways
  run the same threads and their CPU outputs compare exactly.

A node is a :class:`~kcache_testkit.nodes.Node`: its own ``HOME`` and ``TMPDIR``, no cache dir
variable of torch, Triton or kcache, the settings given (e.g. ``KCACHE_URL``, ``KCACHE_WORKLOAD``)
and the kit on ``PYTHONPATH``. ``XDG_CACHE_HOME`` is dropped (it would move kcache's local tier out
of the node); a user site (``pip install --user``) stays visible.
"""

from __future__ import annotations

import json
import os
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache_testkit.nodes import Node
from kcache_testkit.ports import HOST, free_port, kill
from kcache_testkit.service import with_testkit

# Run as a module from the node's own directory (PYTHONPATH finds the kit), so the job's
# sys.path[0] is not the kit's folder, whose modules (kernels, models, service, ...) would
# otherwise shadow top-level packages of those names for torch or transformers.
JOB_MODULE = "kcache_testkit.ddp_job"
MODES = ("torchrun", "independent")


def node_env(node: Node, **settings: str) -> dict[str, str]:
    env = with_testkit(node.env(**settings))
    for name in ("XDG_CACHE_HOME", "KCACHE_PREFETCH_PID"):
        env.pop(name, None)
    env.setdefault("PYTHONUSERBASE", site.getuserbase())
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # models are built from configs
    return env


@dataclass
class NodeRun:
    """A node's ranks, running: :meth:`wait` collects them."""

    mode: str
    out: Path
    nproc: int
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    started_at: float  # wall clock when the first process was started
    t0: float  # perf_counter then

    def wait(self, timeout: float) -> dict[str, Any]:
        """``{"ok", "wall_s", "rc", "timed_out", "ranks": [report per rank, rank order], "error"}``.
        A node still running after ``timeout`` seconds is killed with its sessions (its ranks and
        their compile workers)."""
        deadline = self.t0 + timeout
        timed_out = False
        rcs: list[int | None] = []
        for proc in self.procs:
            try:
                rcs.append(proc.wait(timeout=max(0.1, deadline - time.perf_counter())))
            except subprocess.TimeoutExpired:
                timed_out = True
                rcs.append(None)
        if timed_out:
            self.kill()
        wall = time.perf_counter() - self.t0
        ranks: list[dict[str, Any] | None] = []
        for rank in range(self.nproc):
            path = self.out / f"rank{rank}.json"
            report = json.loads(path.read_text()) if path.exists() else None
            if report is not None:
                report["time_to_first_result_s"] = report["first_result_at"] - self.started_at
            ranks.append(report)
        ok = not timed_out and all(rc == 0 for rc in rcs) and all(r is not None for r in ranks)
        run: dict[str, Any] = {"ok": ok, "mode": self.mode, "wall_s": wall, "rc": rcs, "timed_out": timed_out, "ranks": ranks,
                               "logs": [str(p) for p in self.logs]}
        if not ok:
            tails = [p.read_text(errors="replace")[-1500:] for p in self.logs if p.exists()]
            why = f"timeout after {timeout:.0f} s (killed)" if timed_out else f"exit codes {rcs}"
            run["error"] = why + ("; missing rank reports" if None in ranks else "") + "\n" + "\n---\n".join(tails)
        return run

    def kill(self) -> None:
        """Stop the node: SIGTERM first (torchrun's agent then stops its ranks, which it started
        in sessions of their own), SIGKILL after a grace period; then any rank still running
        (its command line names this node's output dir), with its session."""
        for proc in self.procs:
            kill(proc, signal.SIGTERM, group=True)
        marker = f"\0--out\0{self.out}\0".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if marker in (entry / "cmdline").read_bytes() + b"\0":
                    os.killpg(int(entry.name), signal.SIGKILL)  # a rank leads its own session
            except OSError:  # gone meanwhile, or not a session leader: nothing of ours to stop
                continue


def launch(node: Node, mode: str, out: Path, job_args: list[str], nproc: int = 2, **settings: str) -> NodeRun:
    """Start ``nproc`` ranks of ``ddp_job.py`` on ``node`` (``mode``: one of :data:`MODES`);
    ``job_args`` go to every rank (``--device``, ``--model``, ...; ``--out`` is ``out``).
    Each process's stdout and stderr go to ``out/<name>.log``."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    out.mkdir(parents=True, exist_ok=True)
    env = node_env(node, **settings)
    port = str(free_port())
    job = ["-m", JOB_MODULE, *job_args, "--out", str(out)]
    procs, logs = [], []

    def start(cmd: list[str], proc_env: dict[str, str], name: str) -> None:
        log = out / f"{name}.log"
        with log.open("wb") as f:
            procs.append(subprocess.Popen(cmd, env=proc_env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                          cwd=node.root, start_new_session=True))
        logs.append(log)

    started_at, t0 = time.time(), time.perf_counter()
    if mode == "torchrun":
        start([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--master-addr", HOST, "--master-port", port, *job], env, "torchrun")
    else:
        for rank in range(nproc):
            rank_env = env | {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                              "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": HOST, "MASTER_PORT": port}
            rank_env.setdefault("OMP_NUM_THREADS", "1")
            start([sys.executable, *job], rank_env, f"rank{rank}")
    return NodeRun(mode, out, nproc, procs, logs, started_at, t0)
