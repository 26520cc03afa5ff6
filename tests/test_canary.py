"""The key-soundness canary against the bug class it exists for: a cache key that misses a factor.

Real jobs (tests/unsound_key_job.py), each a fresh interpreter with its own HOME and TMPDIR, only
``KCACHE_*`` set, against one real service. In the job only, torch's key is made unsound: the
FX-graph key drops an Inductor setting that changes the generated code
(``cpp.inject_relu_bug_TESTING_ONLY``), or Triton's key drops ``num_warps``. Node A compiles
with one value, node B with the other:

* without the canary, B is served A's code (the bug: wrong numbers, or a kernel for other warps);
* with ``KCACHE_CANARY=1``, a node with A's value audits the entry and agrees (counted), and B
  compiles its own, runs it, and the entry is quarantined with a report naming the setting;
* node C, without the canary, is not served the entry any more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kcache.cli import main as kcache_main
from kcache.store.counters import load_stats
from kcache_schemas.unsound_reports import UnsoundReport

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S

pytestmark = pytest.mark.torch
pytest_plugins = ["live"]

JOB = Path(__file__).with_name("unsound_key_job.py")
DROPPED = "cpp.inject_relu_bug_TESTING_ONLY"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from live import LiveService

    with LiveService(tmp_path_factory.mktemp("canary-service")) as svc:
        yield svc


def run(node: Node, url: str, namespace: str, **env: str) -> tuple[dict[str, Any], Path]:
    stats = node.root / "stats.json"
    proc = subprocess.run(
        [sys.executable, str(JOB)], capture_output=True, text=True, cwd=node.root, timeout=HANG_S, stdin=subprocess.DEVNULL,
        env=node.env(KCACHE_URL=url, KCACHE_NAMESPACE=namespace, KCACHE_STATS_FILE=str(stats), **env),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), stats


def findings(stats: Path) -> dict[str, dict[str, int]]:
    return load_stats(stats).verification


def unsound_metric(url: str, layer: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=HANG_S).text.splitlines():
        if line.startswith(f'kcache_unsound_keys_total{{layer="{layer}"}}'):
            return float(line.split()[-1])
    raise AssertionError("kcache_unsound_keys_total missing")


def explain_key(capsys: pytest.CaptureFixture[str], url: str, namespace: str, key: str) -> str:
    capsys.readouterr()
    assert kcache_main(["explain", "--url", url, "--namespace", namespace, "--key", key]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_an_fx_key_without_a_codegen_setting_is_served_wrong_code_until_the_canary_catches_it(
    service: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, ns = service.url, "unsound-fx"
    fx = {"UNSOUND_LAYER": "fx-graph", "UNSOUND_DROP": DROPPED}
    buggy, _ = run(Node(tmp_path / "a"), url, ns, JOB_RELU_BUG="accuracy", **fx)
    assert buggy == {"matches_eager": False}  # node A generates the wrong relu on purpose

    # The bug: node B did not ask for the wrong relu, but the key cannot tell, and it is served A's code.
    served, stats = run(Node(tmp_path / "b"), url, ns, **fx)
    assert served == {"matches_eager": False}
    assert load_stats(stats).layers["fx-graph"].hits >= 1 and not findings(stats)

    # A canary on a node with A's settings compiles the same code: agreement, counted, nothing quarantined.
    same, stats = run(Node(tmp_path / "a2"), url, ns, JOB_RELU_BUG="accuracy", KCACHE_CANARY="1", **fx)
    assert same == {"matches_eager": False}
    assert findings(stats) == {"audited": {"fx-graph: same generated code": 1}}

    # With the canary, node B compiles the key itself, runs its own code, and quarantines the entry.
    audited, stats = run(Node(tmp_path / "b2"), url, ns, KCACHE_CANARY="1", **fx)
    assert audited == {"matches_eager": True}
    [(finding, count)] = findings(stats)["unsound"].items()
    assert finding == "fx-graph: unsound key: own compile differs from the entry in generated code" and count == 1
    assert unsound_metric(url, "fx-graph") == 1
    [listed] = httpx.get(f"{url}/v1/{ns}/unsound", timeout=HANG_S).json()["items"]
    report = UnsoundReport.model_validate(listed)
    assert report.key.startswith("pt2:fx-graph-v1::") and report.producer is not None
    assert [(s.name, s.stored, s.wanted) for s in report.suspects] == [(f"inductor_config[{DROPPED}]", "accuracy", "None")]
    assert any("clamp_min" in line for line in report.output_diff), report.output_diff  # own: the real relu
    quarantine = httpx.get(f"{url}/v1/{ns}/entries/fx-graph/{report.key}/quarantine", timeout=HANG_S).json()
    assert quarantine["reason"].startswith("unsound key")

    # Node C, without the canary, is not served the entry: it compiles its own code.
    fresh, stats = run(Node(tmp_path / "c"), url, ns, **fx)
    assert fresh == {"matches_eager": True}
    assert load_stats(stats).layers["fx-graph"].miss_reasons.get("quarantined", 0) >= 1

    out = explain_key(capsys, url, ns, report.consumer.key)
    assert "UNSOUND KEY" in out and f"inductor_config[{DROPPED}]: accuracy -> None" in out, out
    assert "-" in out and "clamp_min" in out


def test_a_triton_key_without_num_warps_is_served_another_kernel_until_the_canary_catches_it(
    service: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, ns = service.url, "unsound-kernel"
    kernel = {"UNSOUND_LAYER": "kernel"}
    first, _ = run(Node(tmp_path / "a"), url, ns, KERNEL_NUM_WARPS="4", **kernel)
    assert first["num_warps"] == 4
    served, stats = run(Node(tmp_path / "b"), url, ns, KERNEL_NUM_WARPS="8", **kernel)
    assert served == {"key": first["key"], "num_warps": 4}  # the bug: asked for 8 warps, got A's kernel
    assert load_stats(stats).layers["kernel"].hits == 1

    same, stats = run(Node(tmp_path / "a2"), url, ns, KERNEL_NUM_WARPS="4", KCACHE_CANARY="100%", **kernel)
    assert same["num_warps"] == 4 and findings(stats) == {"audited": {"kernel: same IR and binaries": 1}}

    audited, stats = run(Node(tmp_path / "b2"), url, ns, KERNEL_NUM_WARPS="8", KCACHE_CANARY="1", **kernel)
    assert audited == {"key": first["key"], "num_warps": 8}  # its own kernel
    assert list(findings(stats)) == ["unsound"]
    [listed] = httpx.get(f"{url}/v1/{ns}/unsound", timeout=HANG_S).json()["items"]
    report = UnsoundReport.model_validate(listed)
    assert [(s.name, s.stored, s.wanted) for s in report.suspects] == [("options[num_warps]", "4", "8")]
    assert unsound_metric(url, "kernel") == 1

    fresh, stats = run(Node(tmp_path / "c"), url, ns, KERNEL_NUM_WARPS="8", **kernel)
    assert fresh["num_warps"] == 8
    assert load_stats(stats).layers["kernel"].miss_reasons == {"quarantined": 1}

    out = explain_key(capsys, url, ns, report.key)
    assert "UNSOUND KEY" in out and "options[num_warps]: 4 -> 8" in out and "own/scale.ttgir" in out, out
