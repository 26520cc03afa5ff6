"""One download per node (issue #31): processes of one node that start independently (one HOME,
so one kcache local tier, and no common parent: SLURM ``srun``, a container per rank) download
each kernel pack and cache entry once, and the workload prefetch once, whoever starts first.

Every process is a real interpreter running ``tests/fleet_job.py`` (real sm_90 Triton kernels
through Triton's cache manager, a real ``torch.compile`` through Inductor's FX-graph and
AOTAutograd caches) against a real ``kcache serve``, activated by the environment as a user's
job is. Each "rank" has its own Triton and Inductor dirs, so each needs every kernel and entry
from kcache's shared local tier. What the service sent is read from its metrics
(``kcache_bytes_sent_total`` per cache layer) and its access log (requests per path).

Before the node-wide claim and per-key locks, 8 such processes made the service send 7.0x the
bytes one fresh node needs (7 batch-gets and 7 GETs of each entry; measured with this test against the client before).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S
from kcache_testkit.service import ServerProcess, clean_env, with_testkit

pytest.importorskip("torch")
# Nine to eleven interpreters that import torch and compile, most of them at once.
# The node's local tier and the service decide what is downloaded, not torch's version: the
# default torch only (the torch matrix runs test_fleet's prefetch and hit paths).
pytestmark = [pytest.mark.slow, pytest.mark.one_torch]

JOB = Path(__file__).with_name("fleet_job.py")
WORKLOAD = "node-once"
LAYERS = "fx-graph,aot-autograd"  # the layers a CPU compile exercises
RANKS = 8
_ACCESS = re.compile(r'"(\w+) (/v1/[^ ?]+)\S* HTTP/[0-9.]+" (\d+)$')
_SENT = re.compile(r'^kcache_bytes_sent_total\{layer="([^"]+)"\} ([0-9.e+]+)$', re.MULTILINE)

# A prefetcher that stalls after writing its first pack into the tier until it is killed: the
# process the test kills "halfway" (started without the .pth hook, then as the hook starts it).
STALLING_PREFETCHER = """
import sys, time
from kcache.store.local_store import LocalEntryStore
put = LocalEntryStore.put
def put_then_stall(self, layer, key, data):
    put(self, layer, key, data)
    print("HOLDING", flush=True)
    time.sleep(3600)
LocalEntryStore.put = put_then_stall
from kcache.config import ClientConfig
from kcache.current import ensure_runtime
ensure_runtime(ClientConfig.from_env())
time.sleep(3600)
"""


def _env(node: Node, rank: int, url: str, **extra: str) -> dict[str, str]:
    rank_dir = node.root / f"rank{rank}"
    return with_testkit(node.env(
        KCACHE_URL=url, KCACHE_LAYERS=LAYERS, TRITON_CACHE_DIR=str(rank_dir / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(rank_dir / "inductor"), TRITON_DEFAULT_FP_FUSION="1", **extra,
    ))


def _start(node: Node, rank: int, url: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(JOB)], env=_env(node, rank, url, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])  # type: ignore[no-any-return]


def _run(node: Node, url: str, **extra: str) -> dict[str, Any]:
    return _report(_start(node, 0, url, **extra))


class Service:
    """What the service sent, between two looks: cache-layer bytes and requests per path."""

    def __init__(self, srv: ServerProcess) -> None:
        self.srv = srv
        self._bytes, self._log = self._sent(), len(self.srv.stderr())

    def _sent(self) -> float:
        text = httpx.get(f"{self.srv.url}/metrics", timeout=HANG_S).text
        return sum(float(v) for layer, v in _SENT.findall(text) if layer != "api")

    def since(self) -> tuple[float, Counter[tuple[str, str]]]:
        """``(cache bytes sent, Counter of (method, path) of requests)`` since this look."""
        requests: Counter[tuple[str, str]] = Counter()
        for line in self.srv.stderr()[self._log:].splitlines():
            record = json.loads(line) if line.startswith("{") else {}
            found = _ACCESS.search(record.get("msg", "")) if record.get("logger") == "uvicorn.access" else None
            if found is not None:
                requests[(found.group(1), unquote(found.group(2)))] += 1
        return self._sent() - self._bytes, requests


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, Any]]]:
    """A real ``kcache serve`` (access log on) holding a published workload, and the output of
    the job with kcache off (the reference every node must reproduce)."""
    root = tmp_path_factory.mktemp("node-once")
    with ServerProcess(root / "data", root, env=clean_env(KCACHE_LOG_LEVEL="info")) as srv:
        off = _run(Node(root / "off"), srv.url, KCACHE_MODE="off")
        producer = _run(Node(root / "producer"), srv.url, KCACHE_WORKLOAD=WORKLOAD)
        assert producer["out"] == off["out"] and producer["stats"]["kernel"]["puts"] == 3
        yield srv, off


def _fetches(requests: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    """Requests that download cache bytes: batch-gets, pack GETs, entry GETs."""
    return Counter({k: n for k, n in requests.items()
                    if k[1].endswith("kernels:batch-get") or (k[0] == "GET" and ("/kernels/" in k[1] or "/entries/" in k[1]))})


def test_independent_processes_of_a_node_fetch_each_pack_and_entry_once(service: tuple[ServerProcess, dict[str, Any]], tmp_path: Path) -> None:
    srv, off = service
    look = Service(srv)
    one = _run(Node(tmp_path / "fresh"), srv.url, KCACHE_WORKLOAD=WORKLOAD)  # what one fresh node needs
    one_bytes, one_requests = look.since()
    assert one["out"] == off["out"] and one["triton_cache_hits"] == [True] * 3
    assert one_bytes > 0

    node = Node(tmp_path / "node")  # one HOME: one local tier for the eight
    look = Service(srv)
    procs = [_start(node, rank, srv.url, KCACHE_WORKLOAD=WORKLOAD) for rank in range(RANKS)]
    reports = [_report(p) for p in procs]
    eight_bytes, eight_requests = look.since()
    print(f"\ncache bytes sent: one fresh node {one_bytes:.0f}, {RANKS} processes of one node {eight_bytes:.0f} "
          f"({eight_bytes / one_bytes:.2f}x); downloads {sum(_fetches(eight_requests).values())} vs {sum(_fetches(one_requests).values())}")

    for r in reports:
        assert r["out"] == off["out"]
        assert r["triton_cache_hits"] == [True] * 3, r["triton_cache_hits"]  # every kernel from kcache
        assert r["fx"].get("fxgraph_cache_hit") == 1 and r["aot"].get("autograd_cache_hit") == 1
        assert all(layer["errors"] == 0 for layer in r["stats"].values()), r["stats"]
    fetches = _fetches(eight_requests)
    assert fetches == _fetches(one_requests), f"{RANKS} processes downloaded {fetches}, one node {_fetches(one_requests)}"
    assert all(n == 1 for n in fetches.values()), fetches  # each pack batch and entry once
    assert eight_bytes == one_bytes
    assert eight_requests[("GET", f"/v1/default/workloads/{WORKLOAD}")] == RANKS  # only the small manifest each


def test_a_prefetcher_killed_halfway_costs_the_node_one_retry_not_a_hang(service: tuple[ServerProcess, dict[str, Any]], tmp_path: Path) -> None:
    """The process prefetching for the node writes one pack into the tier and stalls; seven
    more start and wait for it; it is killed (SIGKILL: no exit handler runs). The claim goes with
    it, one of the seven pulls what is missing (one more batch-get, of the packs the dead one had
    not written; every entry once), and all seven finish with kcache-off's output."""
    srv, off = service
    node = Node(tmp_path / "node")
    look = Service(srv)
    stalled = subprocess.Popen([sys.executable, "-c", STALLING_PREFETCHER], stdout=subprocess.PIPE, text=True,
                               env=_env(node, 99, srv.url, KCACHE_WORKLOAD=WORKLOAD, KCACHE_AUTOLOAD="0"))
    try:
        assert stalled.stdout is not None and stalled.stdout.readline().strip() == "HOLDING"
        procs = [_start(node, rank, srv.url, KCACHE_WORKLOAD=WORKLOAD) for rank in range(RANKS - 1)]
        manifest = ("GET", f"/v1/default/workloads/{WORKLOAD}")
        while look.since()[1][manifest] < RANKS:  # all seven asked for the manifest: they are waiting
            assert all(p.poll() is None for p in procs), "a process ended while the prefetcher held the node's claim"
            time.sleep(0.2)
    finally:
        stalled.kill()
        stalled.wait()
    reports = [_report(p) for p in procs]
    _sent, requests = look.since()
    for r in reports:
        assert r["out"] == off["out"] and r["triton_cache_hits"] == [True] * 3
        assert r["fx"].get("fxgraph_cache_hit") == 1
        assert all(layer["errors"] == 0 for layer in r["stats"].values()), r["stats"]
    fetches = _fetches(requests)
    batch = next(k for k in fetches if k[1].endswith("kernels:batch-get"))
    assert fetches[batch] == 2, fetches  # the dead prefetcher's, and one retry
    assert all(n == 1 for k, n in fetches.items() if k != batch), fetches  # every entry once


# ---- one key, fetched on demand (not promised by a workload) ------------------------------------

FETCH_ENTRY = """
import json, sys
from kcache.config import ClientConfig
from kcache.runtime import Runtime
rt = Runtime(ClientConfig(url=sys.argv[1], mode="readonly", read_timeout_s=30.0))
data = rt.get_entry("fx-graph", sys.argv[2]) or b""
rt.close()
print(json.dumps({"size": len(data), "errors": sum(c.errors for c in rt.stats.snapshot().values())}))
"""


def test_processes_of_a_node_fetch_an_entry_they_all_need_once(tmp_path: Path) -> None:
    """Four processes of a node need the same entry at once, and no workload promised it: one
    downloads it (the service takes a second to answer), the others wait on the node's lock for
    that key and read it from the tier. Before the lock, each downloaded it."""
    from kcache_testkit.netfaults import FaultServer, Request, http_response

    key = "pt2:fx-graph-v1::fetchedonce:c1"
    blob = bytes(range(256)) * 4096
    gets: list[str] = []

    def slow_service(req: Request) -> bytes:
        if req.method == "GET" and "/entries/fx-graph/" in req.path:
            gets.append(req.path)
            time.sleep(1.0)  # long enough that the four overlap
            return http_response(200, blob, {"Content-Type": "application/octet-stream"})
        return http_response(404, b"{}", {"Content-Type": "application/json"})

    node = Node(tmp_path / "node")
    with FaultServer("http", handler=slow_service) as server:
        env = with_testkit(node.env(KCACHE_AUTOLOAD="0"))
        procs = [subprocess.Popen([sys.executable, "-c", FETCH_ENTRY, server.url, key], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        outs = [p.communicate(timeout=HANG_S) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _out, err in outs]
    assert [json.loads(out.strip().splitlines()[-1]) for out, _err in outs] == [{"size": len(blob), "errors": 0}] * 4
    assert len(gets) == 1, gets
