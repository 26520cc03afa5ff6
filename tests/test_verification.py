"""Post-install verification counters and the start-up phase breakdown, with real compiles:
what a job fetched but never used, a kernel kcache wrote that Triton compiled anyway, and where
start-up time went (torch's own phase timers), in the stats file, ``kcache stats`` and the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kcache.cli.commands import main as kcache_main
from kcache.config import ClientConfig
from kcache.current import get_runtime
from kcache.store.counters import load_stats
from kcache.store.fingerprint import current
from kcache.transport.http import KcacheClient
from kcache_schemas import wire

from kcache_testkit.kernels import real_kernels
from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S

pytest.importorskip("torch")

pytestmark = pytest.mark.torch
pytest_plugins = ["live"]

JOB = Path(__file__).with_name("host_job.py")


def run_job(node: Node, url: str, **env: str) -> Path:
    stats = node.root / "stats.json"
    proc = subprocess.run(
        [sys.executable, str(JOB)], capture_output=True, text=True, cwd=node.root, timeout=HANG_S, stdin=subprocess.DEVNULL,
        env=node.env(KCACHE_URL=url, KCACHE_STATS_FILE=str(stats), HOST_JOB="compile", **env),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return stats


@pytest.mark.slow
def test_phases_and_unused_prefetches_of_a_cold_and_a_warm_run(live_service, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = live_service.url
    cold = load_stats(run_job(Node(tmp_path / "cold"), url, KCACHE_WORKLOAD="verify", KCACHE_RUN_ID="verify-cold"))
    # Torch's own timers: the cold node traced (Dynamo) and lowered (Inductor).
    assert cold.phases, cold
    assert any("compile_inner" in name or "bytecode_tracing" in name for name in cold.phases), cold.phases
    assert any("compile_fx" in name or "inductor" in name.lower() for name in cold.phases), cold.phases
    assert cold.verification == {}

    # The workload also promises an entry no compile of this job asks for (a graph it no longer has).
    client = KcacheClient(ClientConfig(url=url, read_timeout_s=HANG_S))
    client.put_entry("fx-graph", "pt2:fx-graph-v1::fdrifted:c1", b"a graph of an older version of the job")
    manifest = {"name": "verify", "fingerprint": current().model_dump(), "kernels": [],
                "entries": [{"layer": "fx-graph", "key": "pt2:fx-graph-v1::fdrifted:c1"}]}
    client.put_json(wire.path(wire.WORKLOAD, namespace="default", name="verify"), json.dumps(manifest))

    warm_file = run_job(Node(tmp_path / "warm"), url, KCACHE_WORKLOAD="verify", KCACHE_RUN_ID="verify-warm")
    warm = load_stats(warm_file)
    assert warm.layers["fx-graph"].hits >= 1
    assert warm.verification["fetched_unused"] == {"fx-graph: prefetched, never asked for": 1}
    assert any("FxGraphCache" in n or "fx_graph_cache" in n or "load" in n for n in warm.phases), warm.phases

    capsys.readouterr()
    assert kcache_main(["stats", "--file", str(warm_file)]) == 0
    out = capsys.readouterr().out
    assert "Start-up phases" in out and "Dynamo" in out and "kcache (lookups, downloads, local tier)" in out, out
    assert "Fetched, never used: fx-graph: prefetched, never asked for x1" in out, out

    # The run on the service keeps both, for the dashboard and `kcache stats --run`.
    assert kcache_main(["stats", "--run", "verify-warm", "--url", url, "--format", "json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["verification"]["fetched_unused"] == {"fx-graph: prefetched, never asked for": 1}
    assert run["phases"] and set(run["phases"]) == set(warm.phases)


def test_a_kernel_kcache_wrote_that_triton_compiles_anyway_is_counted(live_service, tmp_path: Path) -> None:
    """kcache installs a kernel into one dir; Triton, reading another, compiles it itself."""
    import kcache

    from kcache_testkit.corpus import compile_small

    [kernel] = real_kernels(tmp_path / "made-elsewhere", count=1)  # before kcache: not uploaded
    kcache.install(url=live_service.url, layers="none")
    try:
        rt = get_runtime()
        assert rt is not None
        rt.emit_local(tmp_path / "inductor-dir", kernel.manifest, kernel.files)
        [compiled] = compile_small(tmp_path / "tritons-dir", count=1)  # the service has no copy
        assert compiled.name == kernel.key
        assert rt.stats.document().verification == {"emitted_then_compiled": {"kernel: written into another dir": 1}}
    finally:
        kcache.uninstall()
