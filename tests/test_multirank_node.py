"""A multi-rank job on one node downloads each artifact once (issue #33, the CPU half).

Two ranks of a DDP train step under ``torch.compile`` (``kcache_testkit/ddp_job.py``, the torch-only
``mlp-lm``, gloo), started as two independent interpreters with ``RANK``/``WORLD_SIZE``/...
set by hand (no common parent: each would prefetch on its own but for the node's claim), on a
fresh node (own ``HOME``/``TMPDIR``, ``KCACHE_URL`` and ``KCACHE_WORKLOAD`` only), against a real
``kcache serve`` that a populating node of the same job filled. The service's download log
(``KCACHE_DOWNLOAD_LOG``) proves each pack and entry of the workload went to the node once; both
ranks hit kcache with no miss and reproduce the populating run's outputs exactly.
``bench/gpu_multirank.py`` runs the same job on 2 GPUs (NCCL) and with torchrun too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kcache_testkit.download_log import DownloadLog
from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S
from kcache_testkit.ranks import launch
from kcache_testkit.service import ServerProcess, server_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

WORKLOAD = "ddp-node-once"
JOB_ARGS = ["--device", "cpu", "--model", "mlp-lm"]


def _ranks(node: Node, url: str, **settings: str) -> list[dict[str, Any]]:
    run = launch(node, "independent", node.root / "out", JOB_ARGS, 2, KCACHE_URL=url, KCACHE_WORKLOAD=WORKLOAD, **settings)
    result = run.wait(timeout=HANG_S)
    assert result["ok"], result.get("error")
    logs = "\n".join(Path(p).read_text(errors="replace") for p in result["logs"])
    assert "Traceback" not in logs and "kcache:" not in logs, logs[-3000:]
    return result["ranks"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[dict[str, Any]]]]:
    """A service holding the job's workload, and the populating node's reports."""
    root = tmp_path_factory.mktemp("multirank")
    env = server_env(root, KCACHE_LOG_LEVEL="info", KCACHE_DOWNLOAD_LOG="1")
    with ServerProcess(root / "data", root, env=env, name="kcache") as srv:
        populate = _ranks(Node(root / "populate"), srv.url, KCACHE_FLUSH_TIMEOUT_S="60")
        assert all(r["kcache"]["layers"] and sum(c["puts"] for c in r["kcache"]["layers"].values()) for r in populate)
        yield srv, populate


def test_two_independent_ranks_of_a_node_download_each_artifact_once_and_hit(
    filled: tuple[ServerProcess, list[dict[str, Any]]], tmp_path: Path
) -> None:
    srv, populate = filled
    view = httpx.get(f"{srv.url}/v1/default/workloads/{WORKLOAD}", timeout=HANG_S).json()
    workload = {("kernel", k) for k in view["kernels"]} | {(e["layer"], e["key"]) for e in view["entries"]}
    assert workload, view

    served = DownloadLog(srv.log)
    served.take()
    ranks = _ranks(Node(tmp_path / "node"), srv.url)
    downloads = served.take().per_artifact()

    assert set(downloads) == workload, (sorted(downloads), sorted(workload))
    assert set(downloads.values()) == {1}, downloads  # each pack and entry once for the node
    hits = 0
    for rank, before in zip(ranks, populate, strict=True):
        assert rank["output"] == before["output"]  # exactly the populating run's numbers
        # Both ranks hit: neither compiled a graph. A rank may take some from Inductor's own
        # cache, which its sibling (same TMPDIR) filled from kcache a moment earlier, so kcache's
        # hits are counted for the node; no rank missed or failed in kcache.
        assert rank["inductor"].get("fxgraph_cache_hit", 0) >= 1 and not rank["inductor"].get("fxgraph_cache_miss"), rank["inductor"]
        assert rank["aot_autograd"].get("autograd_cache_hit", 0) >= 1 and not rank["aot_autograd"].get("autograd_cache_miss"), rank["aot_autograd"]
        layers = rank["kcache"]["layers"]
        assert sum(c["misses"] + c["errors"] for c in layers.values()) == 0, layers
        hits += sum(c["hits"] for c in layers.values())
    assert hits >= len(workload)
