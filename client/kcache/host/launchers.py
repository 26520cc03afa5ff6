"""The run id of a job that did not set ``KCACHE_RUN_ID``, from its launcher's own variables.

A run is what the service sums per job (:mod:`kcache_server.store.run_reports`); like Bazel's invocation id or
sccache's per-job stats, a job should not have to name itself to be counted. Every process of
one job must arrive at the same id, including the ranks of a torchrun job and the processes they
start (compile workers inherit the environment, not the parent's state), and a later step of the
same job (``kcache stats`` in a CI step) must arrive at it too; so the id is a pure function of
the environment. The outermost launcher wins: a torchrun inside a CI job or a SLURM allocation
is one part of that job, and a CI job's hit-rate gate reads the whole job.

    GitHub Actions   gh-<GITHUB_RUN_ID>-<GITHUB_RUN_ATTEMPT>-<GITHUB_JOB>   (a job; matrix entries share it)
    GitLab CI        gl-<CI_PIPELINE_ID>-<CI_JOB_ID>
    Buildkite        bk-<BUILDKITE_PIPELINE_SLUG>-<BUILDKITE_BUILD_NUMBER>-<BUILDKITE_JOB_ID>
    Jenkins          <BUILD_TAG> (jenkins-<job>-<build number>)
    SLURM            slurm-[<SLURM_CLUSTER_NAME>-]<SLURM_JOB_ID> (every step of the job: the batch
                     script that reads the stats has no step of its own)
    torchrun         torchrun-<TORCHELASTIC_RUN_ID> (the rendezvous id: all ranks, all nodes);
                     with the static rendezvous' id ``none``: torchrun-<host>-<the agent's log dir>,
                     one run per node, since nothing else the ranks share tells this job from the next
    Kubernetes       k8s-<Job name> for an Indexed Job's pods (hostname ``<job>-<index>``), else
                     k8s-<pod name>

With none of these, no run: an interpreter on a workstation or in a notebook is not a job, and
one run per process would bury the fleet's runs on the dashboard under one-process runs while
adding a request at every exit; ``kcache stats`` shows that machine's processes
(:func:`kcache.reporting.report.machine_stats_path`). ``KCACHE_RUN_ID`` always wins.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

EXPLICIT = "KCACHE_RUN_ID"  # the source of an id the job gave itself

# Every variable read below: tests clear them so a suite run inside CI, SLURM or a pod stays hermetic.
LAUNCHER_VARIABLES = (
    "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "GITHUB_JOB",
    "CI_PIPELINE_ID", "CI_JOB_ID",
    "BUILDKITE_PIPELINE_SLUG", "BUILDKITE_BUILD_NUMBER", "BUILDKITE_JOB_ID",
    "BUILD_TAG",
    "SLURM_JOB_ID", "SLURM_CLUSTER_NAME",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
    "KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX",
)

_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_.:+-]+")  # kcache_schemas.keys' run id alphabet


def _run_id(*parts: str) -> str:
    """``parts`` joined by ``-`` in the run id alphabet (``jenkins-team/app build-7`` becomes
    ``jenkins-team_app_build-7``), at most 128 characters."""
    return _NOT_ALLOWED.sub("_", "-".join(parts)).strip("_")[:128]


def _torchrun(env: Mapping[str, str]) -> str | None:
    rdzv = env.get("TORCHELASTIC_RUN_ID", "")
    if rdzv and rdzv != "none":
        return _run_id("torchrun", rdzv)
    # The static rendezvous (--master-addr/--master-port) names every job "none". Each agent keeps
    # its workers' logs in a fresh ``<log dir>/none_<random>/attempt_<n>/<rank>/`` and tells every
    # worker (and what the worker starts) its error file there: unique per agent, shared by its ranks.
    error_file = Path(env.get("TORCHELASTIC_ERROR_FILE", ""))
    if len(error_file.parts) > 3 and error_file.parents[1].name.startswith("attempt_"):
        return _run_id("torchrun", socket.gethostname(), error_file.parents[2].name)
    return None


def _kubernetes(env: Mapping[str, str]) -> tuple[str, str] | None:
    if not env.get("KUBERNETES_SERVICE_HOST"):
        return None
    pod = env.get("HOSTNAME") or socket.gethostname()
    index = env.get("JOB_COMPLETION_INDEX", "")
    if index and pod.endswith(f"-{index}"):  # an Indexed Job's pod: hostname <job name>-<index>
        return _run_id("k8s", pod.removesuffix(f"-{index}")), "JOB_COMPLETION_INDEX"
    return _run_id("k8s", pod), "HOSTNAME"


def derive_run_id(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(run id, the variable it came from)`` for a job without ``KCACHE_RUN_ID``, or None when
    no launcher is recognised. Order: CI systems, SLURM, torchrun, Kubernetes (the module's
    docstring says why)."""
    env = os.environ if env is None else env
    if env.get("GITHUB_RUN_ID"):
        job = [env["GITHUB_JOB"]] if env.get("GITHUB_JOB") else []
        return _run_id("gh", env["GITHUB_RUN_ID"], env.get("GITHUB_RUN_ATTEMPT") or "1", *job), "GITHUB_RUN_ID"
    if env.get("CI_PIPELINE_ID") and env.get("CI_JOB_ID"):
        return _run_id("gl", env["CI_PIPELINE_ID"], env["CI_JOB_ID"]), "CI_JOB_ID"
    if env.get("BUILDKITE_JOB_ID"):
        build = [env[v] for v in ("BUILDKITE_PIPELINE_SLUG", "BUILDKITE_BUILD_NUMBER") if env.get(v)]
        return _run_id("bk", *build, env["BUILDKITE_JOB_ID"]), "BUILDKITE_JOB_ID"
    if env.get("BUILD_TAG", "").startswith("jenkins-"):  # Jenkins: jenkins-${JOB_NAME}-${BUILD_NUMBER}
        return _run_id(env["BUILD_TAG"]), "BUILD_TAG"
    if env.get("SLURM_JOB_ID"):
        cluster = [env["SLURM_CLUSTER_NAME"]] if env.get("SLURM_CLUSTER_NAME") else []
        return _run_id("slurm", *cluster, env["SLURM_JOB_ID"]), "SLURM_JOB_ID"
    if torchrun := _torchrun(env):
        return torchrun, "TORCHELASTIC_RUN_ID"
    return _kubernetes(env)
