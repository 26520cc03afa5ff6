"""The autotune layer on a warm node: asked for, and prefetched only once a node asked for it.

A statically launched autotuner from an FX-graph entry names the producer's kernel source
path, and Inductor's local autotune cache is keyed by that path's directory: a fresh node on the
producer's host read the producer's ``.best_config`` files and never asked kcache (seen on an
H100 with torch 2.11: 18 of 18 autotune entries prefetched and unused; on another host all 18
asked). ``kcache.layers.inductor.autotune_paths`` keys the local cache by the node's own dir. The nodes here are
real interpreters (``tests/autotune_job.py``) with their own HOME/TMPDIR on one host, calling
Inductor's real ``check_autotune_cache``/``AutotuneCache`` (CPU: nothing is benchmarked).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S

pytest.importorskip("torch")
pytestmark = pytest.mark.torch
pytest_plugins = ["live"]

JOB = Path(__file__).with_name("autotune_job.py")


def run(node: Node, kernel_file: str, **kcache: str) -> dict[str, Any]:
    stats = node.root / "stats.json"
    stats.unlink(missing_ok=True)
    env = node.env(KCACHE_STATS_FILE=str(stats), **kcache)
    proc = subprocess.run([sys.executable, str(JOB), kernel_file], env=env, cwd=node.root, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    # No stats file: kcache had nothing to count (no lookup, no prefetch, no upload).
    doc = json.loads(stats.read_text()) if stats.exists() else {"layers": {}}
    result["autotune"] = doc["layers"].get("autotune", {})
    result["verification"] = doc.get("verification", {})
    result["kcache_lines"] = [ln for ln in proc.stderr.splitlines() if "kcache:" in ln]
    return result


@pytest.mark.slow
def test_a_warm_node_on_the_producers_host_asks_kcache_for_the_autotune_winner(live_service, tmp_path: Path) -> None:
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    if "_make_local_cache_key" not in vars(AutotuneCache):  # torch 2.9: the hook point kcache needs is absent
        pytest.skip("this torch keys its local autotune cache without AutotuneCache._make_local_cache_key: not served")
    fleet = {"KCACHE_URL": live_service.url, "KCACHE_WORKLOAD": "autotuned"}
    a = Node(tmp_path / "a")
    produced = run(a, "-", **fleet)  # compiles, "benchmarks", saves the winner (local file + kcache)
    assert produced["state"] == "miss" and produced["autotune"]["puts"] == 1, produced
    assert list((tmp_path / "a" / "tmp").glob("torchinductor_*/*/*.best_config"))

    # The producer again: its own file answers, as always. The winner it wrote is not in the
    # workload (a warm node whose FX entry hits never asks the autotune layer), so nothing was
    # prefetched for nothing (before: "autotune: prefetched, never asked for": 1 on every start).
    again = run(a, "-", **fleet)
    assert again["state"] == "hit" and again["best"] == {"XBLOCK": 256}
    assert not again["autotune"], again
    assert not again["verification"].get("fetched_unused"), again["verification"]

    # A fresh node on the same host, given the producer's path (what the static autotuner in the
    # producer's FX-graph entry carries): it asks kcache, and the service answers.
    b = run(Node(tmp_path / "b"), produced["filename"], **fleet)
    assert b["state"] == "hit" and b["best"] == {"XBLOCK": 256}
    assert b["autotune"]["hits"] == 1 and b["autotune"]["misses"] == 0, b["autotune"]
    assert b["autotune"]["served_by"] == {"service": 1}, b["autotune"]
    assert not b["verification"].get("fetched_unused"), b["verification"]
    assert not b["kcache_lines"], b["kcache_lines"]
    assert not list((tmp_path / "b" / "tmp").glob("torchinductor_*/*/*.best_config"))  # a remote hit writes no file

    # A node asked for it, so the workload lists it now: the next fresh node has it prefetched.
    c = run(Node(tmp_path / "c"), produced["filename"], **fleet)
    assert c["state"] == "hit" and c["best"] == {"XBLOCK": 256}
    assert c["autotune"]["served_by"] == {"prefetch": 1}, c["autotune"]
    assert not c["verification"].get("fetched_unused"), c["verification"]
    assert not c["kcache_lines"], c["kcache_lines"]


def test_own_dir() -> None:
    from kcache.layers.inductor.autotune_paths import own_dir

    assert own_dir("/tmp/me/inductor/ab", "/tmp/me/inductor") == "/tmp/me/inductor/ab"
    assert own_dir("/tmp/me/inductor/deep/er", "/tmp/me/inductor/") == "/tmp/me/inductor/deep/er"
    assert own_dir("/tmp/producer/inductor/ab", "/tmp/me/inductor") == "/tmp/me/inductor/ab"
    assert own_dir("/tmp/me/inductor-other/ab", "/tmp/me/inductor") == "/tmp/me/inductor/ab"
