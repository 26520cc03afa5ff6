"""Runs of jobs that set nothing but ``KCACHE_URL``: the run id comes from the launcher (torchrun,
a CI system, SLURM, Kubernetes; :mod:`kcache.host.launchers`), the run says which variable it came
from, and ``kcache stats`` in a later step of the same job reads that run.

The jobs are real interpreters (real ``torchrun`` with two ranks, each starting a worker process
of its own) against a real service, each on a node of its own (own HOME: kcache's local tier and
this machine's stats live there).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from kcache.host.launchers import derive_run_id

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S
from kcache_testkit.ports import free_port
from kcache_testkit.ranks import node_env

pytest_plugins = ["live"]

# One process of a job: one kernel lookup (a miss on an empty service: cache work to report),
# then with "spawn", a worker process of its own that does the same (Inductor's compile workers,
# DataLoader workers: they inherit the environment, nothing else). Prints the run id it has.
_JOB = textwrap.dedent(
    """
    import os, subprocess, sys
    from pathlib import Path
    from kcache.config import ClientConfig
    from kcache.current import ensure_runtime
    config = ClientConfig.from_env()
    rt = ensure_runtime(config)
    assert rt.fetch_kernel("A" * 52, Path(os.environ["TMPDIR"]) / f"triton-{os.getpid()}") is None
    print(f"run {config.run_id} {config.run_source}", flush=True)
    if sys.argv[1:] == ["spawn"]:
        subprocess.run([sys.executable, __file__], check=True)
    """
)


def _job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    return script


def _runs(url: str) -> list[dict[str, object]]:
    items: list[dict[str, object]] = httpx.get(f"{url}/v1/default/runs").json()["items"]
    return items


def _run(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, *args, str(script)] if args else [sys.executable, str(script)], env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    assert not [ln for ln in out.stderr.splitlines() if ln.startswith("kcache:")], out.stderr  # no warnings
    return out


def _stats(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """``kcache stats`` as a later step of the same job runs it."""
    return subprocess.run([sys.executable, "-m", "kcache.cli", "stats", *argv], env=env, capture_output=True, text=True, timeout=HANG_S)


@pytest.mark.slow
@pytest.mark.torch  # torchrun's variables and log dirs are torch's: the matrix checks each torch
@pytest.mark.parametrize("rendezvous", ["default", "static"])
def test_torchrun_ranks_and_their_workers_are_one_run(live_service, tmp_path: Path, rendezvous: str) -> None:  # type: ignore[no-untyped-def]
    """``torchrun --nproc-per-node 2`` with only KCACHE_URL set: both ranks and the worker each
    starts land in one run, from TORCHELASTIC_RUN_ID. ``default``: torchrun's own rendezvous id
    (a fresh uuid on one node); ``static`` (``--master-port``, as multi-node jobs start): the id
    is "none" for every job, so the run is this node's torchrun agent's."""
    pytest.importorskip("torch")
    env = node_env(Node(tmp_path / "node"), KCACHE_URL=live_service.url)
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
    if rendezvous == "static":
        launcher += ["--master-port", str(free_port())]
    out = subprocess.run([sys.executable, *launcher, str(_job(tmp_path)), "spawn"], env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    said = sorted(ln for ln in out.stdout.splitlines() if ln.startswith("run "))
    assert len(said) == 4 and len(set(said)) == 1, said  # 2 ranks + 2 workers, one id
    runs = _runs(live_service.url)
    assert len(runs) == 1, runs
    run = runs[0]
    run_id = str(run["run_id"])
    assert said[0] == f"run {run_id} TORCHELASTIC_RUN_ID"
    assert run["run_source"] == "TORCHELASTIC_RUN_ID"
    assert run["processes"] == 4 and run["misses"] == 4 and run["hits"] == 0
    per_agent = f"torchrun-{socket.gethostname()}-none_"  # the run of a job torch names "none"
    if rendezvous == "default":
        # torch 2.13's default rendezvous on one node is a fresh id; torch 2.9's names the job
        # "none" as the static one does (seen in the matrix), so the run is the agent's there.
        assert run_id.startswith("torchrun-") and ("none" not in run_id or run_id.startswith(per_agent)), run_id
        return
    assert run_id.startswith(per_agent), run_id
    # Another torchrun job is another run, though the static rendezvous names every job "none".
    again = subprocess.run([sys.executable, *launcher, str(_job(tmp_path))], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert again.returncode == 0, again.stderr
    runs = _runs(live_service.url)
    assert len(runs) == 2 and runs[1]["run_id"] == run_id and runs[0]["processes"] == 2, runs


@pytest.mark.slow
def test_a_ci_job_without_kcache_run_id_is_a_run_that_kcache_stats_reads(live_service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """GitHub Actions' variables name the run (gh-<run>-<attempt>-<job>, as the CI recipe used to
    spell KCACHE_RUN_ID by hand); ``kcache stats`` with no argument in a later step of the job reads
    it from the service and says where the id came from; a process that did no cache work sends
    nothing; KCACHE_RUN_ID still wins over the launcher."""
    script = _job(tmp_path)
    github = {"GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "2", "GITHUB_JOB": "unit-tests"}
    env = node_env(Node(tmp_path / "runner"), KCACHE_URL=live_service.url, **github)
    for _ in range(2):
        assert _run(script, env).stdout.strip() == "run gh-4242-2-unit-tests GITHUB_RUN_ID"
    # An interpreter that only imported kcache and started its runtime: nothing to report.
    idle = subprocess.run([sys.executable, "-c", "from kcache.config import ClientConfig; from kcache.current import ensure_runtime; "
                           "ensure_runtime(ClientConfig.from_env())"], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert idle.returncode == 0, idle.stderr
    # A step of the same job that named its run itself.
    _run(script, {**env, "KCACHE_RUN_ID": "nightly-7"})

    runs = {r["run_id"]: r for r in _runs(live_service.url)}
    assert set(runs) == {"gh-4242-2-unit-tests", "nightly-7"}
    assert runs["gh-4242-2-unit-tests"]["run_source"] == "GITHUB_RUN_ID" and runs["gh-4242-2-unit-tests"]["processes"] == 2
    assert runs["nightly-7"]["run_source"] == "KCACHE_RUN_ID" and runs["nightly-7"]["processes"] == 1

    report = _stats(env, "--format", "json", "--fail-under", "50")
    assert report.returncode == 2, report.stderr  # 2 misses: below the bar
    doc = json.loads(report.stdout)
    assert doc["run_id"] == "gh-4242-2-unit-tests" and doc["run_source"] == "GITHUB_RUN_ID" and doc["processes"] == 2
    text = _stats(env)
    assert text.returncode == 0, text.stderr
    assert "run gh-4242-2-unit-tests (from GITHUB_RUN_ID, namespace default), 2 processes" in text.stdout, text.stdout
    # The step without the service's URL reads this machine's stats instead (every process on it).
    local = _stats({k: v for k, v in env.items() if k != "KCACHE_URL"})
    assert local.returncode == 0 and "this machine" in local.stderr and "3 processes" in local.stdout, local


@pytest.mark.slow
def test_a_process_without_a_launcher_reports_no_run(live_service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """No launcher variable and no KCACHE_RUN_ID (a workstation, a notebook): no run on the
    service, no request at exit; ``kcache stats`` shows this machine's stats."""
    env = node_env(Node(tmp_path / "laptop"), KCACHE_URL=live_service.url)
    assert _run(_job(tmp_path), env).stdout.strip() == "run None None"
    assert _runs(live_service.url) == []
    local = _stats(env)
    assert local.returncode == 0 and "this machine" in local.stderr and "1 process" in local.stdout, local


@pytest.mark.slow
def test_a_run_id_nobody_asked_for_is_sent_quietly(tmp_path: Path) -> None:
    """A SLURM job with a read-only token: the service refuses its run report (403). The job
    did not ask for run stats, so it hears nothing; one that set KCACHE_RUN_ID is told once."""
    from live import LiveService

    token = "read-only-token-0123456789"
    tokens = json.dumps([{"token": token, "name": "reader", "scopes": ["read"]}])
    with LiveService(tmp_path / "svc", tokens=tokens) as svc:
        env = node_env(Node(tmp_path / "node"), KCACHE_URL=svc.url, KCACHE_TOKEN=token, SLURM_JOB_ID="31337")
        assert _run(_job(tmp_path), env).stdout.strip() == "run slurm-31337 SLURM_JOB_ID"  # no warning: _run checks
        named = subprocess.run([sys.executable, str(_job(tmp_path))], env={**env, "KCACHE_RUN_ID": "nightly-7"},
                               capture_output=True, text=True, timeout=HANG_S)
        assert named.returncode == 0, named.stderr
        warned = [ln for ln in named.stderr.splitlines() if ln.startswith("kcache:")]
        assert len(warned) == 1 and "could not send stats for run nightly-7" in warned[0], named.stderr
        assert _runs_with(svc.url, token) == []


def _runs_with(url: str, token: str) -> list[object]:
    items: list[object] = httpx.get(f"{url}/v1/default/runs", headers={"Authorization": f"Bearer {token}"}).json()["items"]
    return items


# ---- the derivation, launcher by launcher (the launchers themselves do not run here) ----------


@pytest.mark.parametrize(("env", "expected"), [
    ({"GITHUB_RUN_ID": "9", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "build"}, ("gh-9-1-build", "GITHUB_RUN_ID")),
    ({"GITHUB_RUN_ID": "9"}, ("gh-9-1", "GITHUB_RUN_ID")),
    ({"CI_PIPELINE_ID": "77", "CI_JOB_ID": "1234"}, ("gl-77-1234", "CI_JOB_ID")),
    ({"BUILDKITE_PIPELINE_SLUG": "train", "BUILDKITE_BUILD_NUMBER": "12", "BUILDKITE_JOB_ID": "0190-ab"},
     ("bk-train-12-0190-ab", "BUILDKITE_JOB_ID")),
    ({"BUILD_TAG": "jenkins-team/app build-7"}, ("jenkins-team_app_build-7", "BUILD_TAG")),
    ({"BUILD_TAG": "something-else"}, None),  # not Jenkins' spelling: not a run
    ({"SLURM_JOB_ID": "31337", "SLURM_CLUSTER_NAME": "eos"}, ("slurm-eos-31337", "SLURM_JOB_ID")),
    ({"SLURM_JOB_ID": "31337"}, ("slurm-31337", "SLURM_JOB_ID")),
    ({"TORCHELASTIC_RUN_ID": "llama-ft-3"}, ("torchrun-llama-ft-3", "TORCHELASTIC_RUN_ID")),
    ({"TORCHELASTIC_RUN_ID": "none"}, None),  # the static rendezvous without torchrun's log dirs
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "bench-7", "JOB_COMPLETION_INDEX": "7"}, ("k8s-bench", "JOB_COMPLETION_INDEX")),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "vllm-5d9c7-x2x4q"}, ("k8s-vllm-5d9c7-x2x4q", "HOSTNAME")),
    ({"HOSTNAME": "laptop"}, None),
    # The outermost launcher wins: a torchrun in a SLURM job in a CI job is the CI job's.
    ({"GITHUB_RUN_ID": "9", "SLURM_JOB_ID": "5", "TORCHELASTIC_RUN_ID": "x"}, ("gh-9-1", "GITHUB_RUN_ID")),
    ({"SLURM_JOB_ID": "5", "TORCHELASTIC_RUN_ID": "x", "KUBERNETES_SERVICE_HOST": "h"}, ("slurm-5", "SLURM_JOB_ID")),
    ({"TORCHELASTIC_RUN_ID": "x", "KUBERNETES_SERVICE_HOST": "h", "HOSTNAME": "p"}, ("torchrun-x", "TORCHELASTIC_RUN_ID")),
])
def test_run_id_from_launcher_variables(env: dict[str, str], expected: tuple[str, str] | None) -> None:
    assert derive_run_id(env) == expected


def test_a_derived_run_id_is_a_valid_run_id() -> None:
    from kcache_schemas import validate_run_id

    derived = derive_run_id({"BUILD_TAG": "jenkins-" + "ä/x " * 100})
    assert derived is not None and validate_run_id(derived[0]) == derived[0] and len(derived[0]) <= 128
