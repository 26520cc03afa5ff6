"""Host safety: kcache never breaks, hangs or changes the result of the process it lives in.

Every scenario runs a real user's job (``tests/host_job.py``) as fresh interpreters, in the user's
default environment: ``HOME`` and ``TMPDIR`` of a node of its own and nothing else set for caches
(no ``TRITON_CACHE_DIR``, no ``TORCHINDUCTOR_CACHE_DIR``: Inductor's dirs are its defaults under
``TMPDIR``, kcache's under ``HOME``), activation by the ``.pth`` at interpreter start, ``import
torch`` racing kcache's threads, exit right after the compile. Each scenario runs up to ``RACE_RUNS`` times
(``KCACHE_HOST_SAFETY_RUNS``, 20 by default), every run pinned to one CPU (``taskset -c``) to widen
races, two runs at a time on a 2-core machine. Every run must exit 0, print no traceback, finish
well inside its deadline, and print exactly what the same job prints with kcache off.

The runs are budgeted by what each scenario can catch. The scenarios where races were found and
fixed keep ``RACE_RUNS`` (20): the workload prefetch at interpreter start racing ``import torch``
(10 of 10 pinned runs broke ``import torch`` before its fix), and a compile that the job exits
right after (the default user path: uploads in flight at exit). Every other scenario runs ``PATH_RUNS``
(``KCACHE_HOST_SAFETY_PATH_RUNS``, 2 by default): they check a deterministic path (an activation
variant, a degraded service's deadlines), which fails on every run when it regresses. A scenario
has two paths, a node's cold first run (it compiles, fills the local caches, uploads) and a warm
restart (local hits, nothing to upload): 2 runs take each once; more repetitions add only time.

The torch matrix (scripts/torch_matrix.sh: the oldest and newest supported torch) runs the
scenarios whose outcome can change with torch's version, with fewer runs: the two race scenarios,
the activation paths that patch and unpatch torch (explicit install before ``import torch``,
reinstall, uninstall), a published workload and ``kcache warm``. The rest are marked
``one_torch`` and run on the default torch only, because what they check is kcache's own logic:
``KCACHE_MODE=off`` (kcache installs nothing), a workload the service does not know (the
prefetcher's 404), read-only (the matrix runs tests/test_settings.py's read-only job, which
checks that nothing is uploaded on each torch) and the degraded services (the client's deadlines
and breaker; the matrix runs tests/test_failopen.py against each torch's hooks).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kcache_testkit import knobs
from kcache_testkit.netfaults import FaultServer, Request, http_response, tar_stream
from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S, bound
from kcache_testkit.service import REPO, ServerProcess, kcache_cmd

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.host_safety, pytest.mark.torch]

RACE_RUNS = knobs.count("KCACHE_HOST_SAFETY_RUNS", 20)
PATH_RUNS = knobs.count("KCACHE_HOST_SAFETY_PATH_RUNS", 2)
JOB = REPO / "tests" / "host_job.py"
# A hang guard, not a timing: about 240 s on an idle machine, scaled by the machine's pace
# measured before each run (kcache_testkit.pace), so a loaded machine does not trip it.
RUN_DEADLINE_PROBES = 480_000
# A run against a dead, blackholed, slow or hostile service may be slower than a healthy one by the
# client's own deadlines (a few 0.5-2.5 s timeouts before the breaker opens), plus the machine's
# variance: bounded by the warm run without kcache, measured in the same module, and the pace.
DEGRADED_DEADLINES_S = 15.0
DEGRADED_WARM_RUNS = 3
_PINNING = shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) > 0


@dataclass
class Run:
    index: int
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def result(self) -> object:
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[-1][len("RESULT "):]) if lines else None

    def describe(self) -> str:
        return f"run {self.index}: rc={self.rc} in {self.seconds:.1f}s\n--- stdout\n{self.stdout[-1500:]}\n--- stderr\n{self.stderr[-4000:]}"


def run_job(node: Node, index: int, job: str, cpu: int | None, **kcache: str) -> Run:
    env = node.env(HOST_JOB=job, **kcache)
    cmd = [sys.executable, str(JOB)]
    if cpu is not None and _PINNING:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=node.root, timeout=bound(0, RUN_DEADLINE_PROBES), stdin=subprocess.DEVNULL)
    return Run(index, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


def run_many(
    node: Node, job: str, runs: int, before_each: Callable[[int], None] | None = None, **kcache: str
) -> list[Run]:
    """``runs`` runs of ``job`` on ``node``, two at a time, each pinned to one CPU."""
    cpus = sorted(os.sched_getaffinity(0))

    def one(i: int) -> Run:
        if before_each is not None:
            before_each(i)
        env = {k: v.replace("{i}", str(i)) for k, v in kcache.items()}
        return run_job(node, i, job, cpus[i % len(cpus)], **env)

    first = one(0)  # the cold start, alone (it fills the node's local caches)
    with ThreadPoolExecutor(max_workers=min(2, len(cpus))) as pool:
        return [first, *pool.map(one, range(1, runs))]


def assert_all_healthy(runs: list[Run], expected: object) -> None:
    assert runs
    for run in runs:
        assert run.rc == 0, run.describe()
        assert "Traceback" not in run.stderr, run.describe()
        assert run.result == expected, run.describe()


def kcache_warnings(run: Run) -> list[str]:
    return [line for line in run.stderr.splitlines() if "kcache:" in line]


# ---- baselines and services -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[object, float]]:
    """What each job prints without kcache (no KCACHE_URL at all), and how long a run of it took:
    for ``compile`` a warm run (the degraded-service scenarios bound their warm restarts by it),
    after a cold one that must print the same; the other jobs once (only their output is used)."""
    node = Node(tmp_path_factory.mktemp("baseline"))
    seen: dict[str, tuple[object, float]] = {}

    def get(job: str) -> tuple[object, float]:
        if job not in seen:
            runs = [run_job(node, i, job, None) for i in range(2 if job == "compile" else 1)]
            for run in runs:
                assert run.rc == 0 and run.result is not None, run.describe()
            assert runs[0].result == runs[-1].result
            seen[job] = (runs[-1].result, runs[-1].seconds)
        return seen[job]

    return get


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("service")
    with ServerProcess(root / "data", root) as server:
        yield server


@pytest.fixture(scope="module")
def published(service: ServerProcess, baseline, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], None]:  # type: ignore[no-untyped-def]
    """An earlier job published a workload (as a user's first run would): once per workload and
    module, shared by the scenarios that start from it (each publisher is a cold interpreter, and
    what a second one would add, a warm node's run, is what those scenarios check)."""
    done: set[str] = set()

    def publish(workload: str) -> None:
        if workload in done:
            return
        compiled, _ = baseline("compile")
        run = run_job(Node(tmp_path_factory.mktemp(f"publisher-{workload}")), 0, "compile", None,
                      KCACHE_URL=service.url, KCACHE_WORKLOAD=workload)
        assert run.rc == 0 and run.result == compiled, run.describe()
        with service.client() as http:
            assert http.get(f"/v1/default/workloads/{workload}").status_code == 200
        done.add(workload)

    return publish


# ---- a healthy service ----------------------------------------------------------------------------


def test_import_torch_races_the_prefetch_of_a_published_workload(service: ServerProcess, baseline, published, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The prefetcher starts at interpreter start while the main thread imports torch. Before the
    fix it imported Inductor's runtime utilities from its thread and broke ``import torch``
    (``cannot import name 'Node' from partially initialized module 'torch.fx'``): 10 of 10 runs
    pinned to one CPU, on a 2-core machine."""
    published("race")
    expected, _ = baseline("import")
    runs = run_many(Node(tmp_path / "node"), "import", RACE_RUNS, KCACHE_URL=service.url, KCACHE_WORKLOAD="race")
    assert len(runs) == RACE_RUNS
    assert_all_healthy(runs, expected)
    assert not [w for run in runs for w in kcache_warnings(run)]


@pytest.mark.parametrize(
    ("name", "job", "env", "runs"),
    [
        ("autoload", "compile", {}, RACE_RUNS),
        ("published-workload", "compile", {"KCACHE_WORKLOAD": "published"}, PATH_RUNS),
        pytest.param("unpublished-workload", "compile", {"KCACHE_WORKLOAD": "fresh-{i}"}, PATH_RUNS, marks=pytest.mark.one_torch),
        ("explicit-install", "install", {"KCACHE_AUTOLOAD": "0", "KCACHE_WORKLOAD": "published"}, PATH_RUNS),
        ("reinstall", "reinstall", {"KCACHE_WORKLOAD": "published"}, PATH_RUNS),
        ("uninstall", "uninstall", {"KCACHE_WORKLOAD": "published"}, PATH_RUNS),
        pytest.param("readonly", "compile", {"KCACHE_MODE": "readonly", "KCACHE_WORKLOAD": "published"}, PATH_RUNS, marks=pytest.mark.one_torch),
        pytest.param("off", "compile", {"KCACHE_MODE": "off", "KCACHE_WORKLOAD": "published"}, PATH_RUNS, marks=pytest.mark.one_torch),
    ],
)
def test_every_activation_path_against_a_healthy_service(  # type: ignore[no-untyped-def]
    name: str, job: str, env: dict[str, str], runs: int, service: ServerProcess, baseline, published, tmp_path: Path
) -> None:
    if env.get("KCACHE_WORKLOAD") == "published":
        published("published")
    expected, _ = baseline(job if job != "install" else "compile")
    done = run_many(Node(tmp_path / "node"), job, runs, KCACHE_URL=service.url, **env)
    assert len(done) == runs
    assert_all_healthy(done, expected)
    # A healthy service gives kcache nothing to warn about.
    assert not [w for run in done for w in kcache_warnings(run)], [kcache_warnings(r) for r in done]


def test_kcache_warm_then_the_job(service: ServerProcess, baseline, published, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A container entrypoint runs ``kcache warm``; the job starts right after it."""
    expected, _ = baseline("compile")
    published("warmed")
    node = Node(tmp_path / "node")

    def warm(i: int) -> None:
        proc = subprocess.run(
            [*kcache_cmd(), "warm", "warmed"], capture_output=True, text=True, timeout=HANG_S,
            env=node.env(KCACHE_URL=service.url), cwd=node.root,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]

    runs = run_many(node, "compile", PATH_RUNS, before_each=warm, KCACHE_URL=service.url, KCACHE_WORKLOAD="warmed")
    assert_all_healthy(runs, expected)


# ---- a service that is dead, blackholed, slow or hostile --------------------------------------------


def _hostile(request: Request) -> bytes:
    """Well-formed HTTP, poisonous content: a workload that promises entries and kernels, a
    batch-get stream with a traversal name, entries that are not Inductor's, junk elsewhere."""
    if request.method == "GET" and "/workloads/" in request.path:
        view = {
            "name": "hostile", "runs": 1, "fingerprint": {},
            "kernels": ["A" * 52], "entries": [{"layer": "fx-graph", "key": "pt2:fx-graph-v1::x:c1"}],
        }
        return http_response(200, json.dumps(view).encode(), {"Content-Type": "application/json"})
    if request.path.endswith("kernels:batch-get"):
        return http_response(200, tar_stream([("../../../escape.kpack", b"x" * 64)]), {"Content-Type": "application/x-tar"})
    if request.method == "GET" and "/entries/" in request.path:
        return http_response(200, b"KCFXG1\n\xff\xff\xff\xffnot a graph", {"Content-Type": "application/octet-stream"})
    return http_response(200, b'{"missing": 7, "invalid": null}', {"Content-Type": "application/json"})


FAULTS: dict[str, Callable[[], FaultServer]] = {
    "dead": lambda: FaultServer("refuse"),
    "blackholed": lambda: FaultServer("hang"),
    "slow": lambda: FaultServer("drip", trickle_interval=0.5),
    "hostile": lambda: FaultServer("http", handler=_hostile),
}


@pytest.mark.one_torch  # the client's deadlines and breaker; the matrix runs tests/test_failopen.py
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_degraded_service_never_breaks_or_hangs_the_job(fault: str, baseline, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    expected, warm_s = baseline("compile")
    with FAULTS[fault]() as server:
        runs = run_many(Node(tmp_path / "node"), "compile", PATH_RUNS, KCACHE_URL=server.url, KCACHE_WORKLOAD="job")
    assert_all_healthy(runs, expected)
    # The cold first run compiles from scratch; the others are warm local restarts.
    allowed = DEGRADED_WARM_RUNS * warm_s + bound(DEGRADED_DEADLINES_S, 60_000)  # ~30 s slack idle
    slow = [run.describe() for run in runs[1:] if run.seconds > allowed]
    assert not slow, slow[:2]
    escaped = [p for p in (tmp_path / "node").rglob("escape*")]
    assert not escaped, escaped
