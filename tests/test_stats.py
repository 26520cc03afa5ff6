"""Client cache-hit stats: KCACHE_STATS_FILE (merge-safe), the KCACHE_REPORT line, run stats sent
to the service, and ``kcache stats`` (text/json/markdown/junit, ``--fail-under``).

The end-to-end test runs a real job twice against a real service: the first run is cold (misses,
then torch's TritonBundler uploads the kernels), the second warm (hits, two "ranks").
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import httpx
import pytest
from kcache.cli.commands import main as kcache_main
from kcache.reporting.report import format_junit, format_markdown, run_report, summary_line
from kcache.store.counters import Stats, load_stats, stats_target, write_stats
from kcache_schemas.models import EnvFingerprint
from kcache_schemas.stats_document import RunStatsReport, StatsDocument, total

from kcache_testkit.pace import HANG_S

pytest_plugins = ["live"]

REPO = Path(__file__).resolve().parent.parent


def _doc(**layers: dict[str, Any]) -> StatsDocument:
    s = Stats()
    for name, c in layers.items():
        for _ in range(c.get("hits", 0)):
            s.hit(name, c.get("nbytes", 0), c.get("saved", 0.0))
        for _ in range(c.get("misses", 0)):
            s.miss(name, c.get("reason", "not_found"))
        for _ in range(c.get("errors", 0)):
            s.error(name, "ServiceUnavailable")
        for _ in range(c.get("puts", 0)):
            s.put(name, 1000)
    return s.document(run_id="r", namespace="default")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = kcache_main(["stats", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def client_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TRITON_CACHE"))}
    env.update({"KCACHE_AUTOLOAD": "0", "KCACHE_LOCAL_DIR": str(tmp_path / "local"), "PYTHONPATH": str(REPO)})
    env.update(extra)
    return env


# ---- arithmetic and the one-line summary ---------------------------------------------------------


def test_errors_count_against_the_hit_rate_and_are_never_misses() -> None:
    doc = _doc(kernel={"hits": 31, "misses": 3, "errors": 2}, **{"fx-graph": {"hits": 10, "saved": 3.5}})
    t = doc.totals()
    assert (t.hits, t.misses, t.errors, t.lookups) == (41, 3, 2, 46)
    assert t.hit_rate == pytest.approx(100 * 41 / 46)
    assert t.saved_s == pytest.approx(35.0)
    assert total([]).hit_rate is None


def test_summary_line() -> None:
    doc = _doc(kernel={"hits": 31, "misses": 3, "nbytes": 400_000, "puts": 2}, **{"fx-graph": {"hits": 10, "saved": 3.8}})
    line = summary_line(doc)
    assert line.startswith("kcache: 41 hits, 3 misses, 0 errors (93.2% hit rate) | fx-graph 10/10 | kernel 31/34 | ")
    assert "12.4 MB down, 2.0 kB up (2 puts)" in line and "~38.0 s compile saved" in line and "\n" not in line
    assert "(1 errors)" in summary_line(_doc(kernel={"hits": 1, "errors": 1}))
    assert "(no lookups)" in summary_line(_doc())


# ---- which tier served each hit ------------------------------------------------------------------


def test_each_hit_is_counted_once_under_the_tier_that_served_it(live_service, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One read path (kcache.store.tiered_store): an entry the node's local tier already held is
    served by ``local``, one the workload's prefetch brought by ``prefetch``, one only the service
    holds by ``service`` (and back-filled, so its next read is ``local``); each hit counted once,
    in the stats document, the summary line, ``kcache stats`` and the run the service sums."""
    from kcache.config import ClientConfig
    from kcache.host.process_roles import PREFETCH_OWNER_ENV
    from kcache.runtime import Runtime
    from kcache.store.local_store import LocalEntryStore
    from kcache.transport.http import KcacheClient
    from kcache.transport.workload import publish
    from kcache_schemas import wire

    layer, workload = "autotune", "tiers"
    held, promised, on_demand = "k-held-locally", "k-promised", "k-on-demand"
    writer = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))  # the test's own calls: a hang guard
    for key in (held, promised, on_demand):
        writer.put_entry(layer, key, key.encode())
    publish(writer, workload, set(), {(layer, promised)})
    monkeypatch.delenv(PREFETCH_OWNER_ENV, raising=False)  # this process may prefetch
    config = ClientConfig(url=live_service.url, mode="readonly", workload=workload, local_dir=str(tmp_path / "local"),
                          read_timeout_s=HANG_S, run_id="tiers-run")
    LocalEntryStore.of(config).put(layer, held, held.encode())  # an earlier job of the node left it

    rt = Runtime(config)
    try:
        assert rt.prefetcher is not None and rt.prefetcher.done.wait(HANG_S)
        assert rt.prefetcher.counts["entries"] == 1, rt.prefetcher.counts
        assert rt.get_entry(layer, held) == held.encode()
        assert rt.get_entry(layer, promised) == promised.encode()
        assert rt.get_entry(layer, on_demand) == on_demand.encode()
        counts = rt.stats.snapshot()[layer]
        assert counts.hits == 3 and counts.served_by == {"local": 1, "prefetch": 1, "service": 1}, counts
        for writer_thread in [th for th in threading.enumerate() if th.name == "kcache-local-put"]:
            writer_thread.join(HANG_S)  # the service's copy is back-filled off the compile thread
        assert rt.get_entry(layer, on_demand) == on_demand.encode()  # now the node's own
        counts = rt.stats.snapshot()[layer]
        assert (counts.hits, counts.misses, counts.errors) == (4, 0, 0)
        assert counts.served_by == {"local": 2, "prefetch": 1, "service": 1}, counts
    finally:
        rt.close()

    doc = rt.stats.document(run_id="tiers-run", namespace="default")
    assert "served by 2 local, 1 prefetch, 1 service" in summary_line(doc)
    stats_file = tmp_path / "stats.json"
    write_stats(stats_file, doc)
    write_stats(stats_file, doc)  # a second process of the same shape: the tiers add up
    rc, out, _ = run_cli(capsys, "--file", str(stats_file))
    assert rc == 0 and "Hits served by" in out and "autotune: 4 local, 2 prefetch, 2 service" in out, out
    assert "autotune 4 local, 2 prefetch, 2 service" in format_markdown(load_stats(stats_file))

    # The run on the service keeps the tiers (the wire contract's served_by).
    path = wire.path(wire.RUN_STATS, namespace="default", run_id="tiers-run")
    httpx.post(f"{live_service.url}{path}", json=run_report(doc).model_dump(mode="json"), timeout=HANG_S).raise_for_status()
    run = httpx.get(f"{live_service.url}{wire.path(wire.RUN, namespace='default', run_id='tiers-run')}", timeout=HANG_S).json()
    assert run["layers"][layer]["served_by"] == {"local": 2, "prefetch": 1, "service": 1}, run["layers"]


# ---- KCACHE_STATS_FILE ---------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys
    from kcache.store.counters import Stats, write_stats
    for i in range(int(sys.argv[2])):
        s = Stats()
        s.hit("kernel", 100)
        s.miss("kernel", "not_found")
        s.error("fx-graph", "ServiceUnavailable")
        write_stats(sys.argv[1], s.document(run_id="ci-7"))
    """
)


def test_many_processes_merge_into_one_file_without_losing_counts(tmp_path: Path) -> None:
    target = tmp_path / "stats" / "kcache.json"  # parent created on demand
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(target), "10"], env=client_env(tmp_path)) for _ in range(6)]
    assert all(p.wait(timeout=HANG_S) == 0 for p in procs)
    doc = load_stats(target)
    assert doc.processes == 60 and doc.run_id == "ci-7"
    assert doc.layers["kernel"].hits == 60 and doc.layers["kernel"].bytes_down == 6000
    assert doc.layers["kernel"].miss_reasons == {"not_found": 60}
    assert doc.layers["fx-graph"].errors == 60 and doc.layers["fx-graph"].misses == 0
    assert not list(target.parent.glob("*.tmp"))  # every replace completed


def test_a_directory_gets_one_file_per_process_and_merges_on_read(tmp_path: Path) -> None:
    d = tmp_path / "statsdir"
    d.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(d), "2"], env=client_env(tmp_path)) for _ in range(3)]
    assert all(p.wait(timeout=HANG_S) == 0 for p in procs)
    files = sorted(d.iterdir())
    assert len(files) == 3 and all(f.name.startswith("kcache-stats-") and f.suffix == ".json" for f in files)
    doc = load_stats(d)
    assert doc.processes == 6 and doc.layers["kernel"].hits == 6
    assert stats_target(str(tmp_path / "new") + "/").name.startswith("kcache-stats-")  # trailing slash: a dir
    with pytest.raises(FileNotFoundError):
        load_stats(tmp_path / "nothing-here")


def test_documents_merge_and_become_run_reports() -> None:
    a = _doc(kernel={"hits": 2}).model_copy(update={"workload": "bert"})
    b = _doc(kernel={"misses": 1, "errors": 1}).model_copy(update={"workload": "bert"})
    merged = StatsDocument.merge([a, b])
    assert merged.processes == 2 and merged.workload == "bert" and merged.workloads == ["bert"]
    assert merged.layers["kernel"].hits == 2 and merged.layers["kernel"].errors == 1
    # The client's body passes the wire contract.
    report = RunStatsReport.model_validate_json(run_report(a).model_dump_json())
    assert report.workload == "bert" and report.layers["kernel"].hits == 2 and report.pid == os.getpid()


def test_a_fleet_mid_upgrade_sees_hit_rates_per_torch_and_triton(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each process's document carries its environment; merged files and reports break the run
    down per torch/triton pair."""
    env_old = EnvFingerprint(torch="2.13.0", triton="3.9.0", cuda="13.0", gpu_arch="sm_90")
    env_new = EnvFingerprint(torch="2.15.0", triton="3.9.0", cuda="13.2", gpu_arch="sm_90")
    old = [_doc(kernel={"hits": 9, "misses": 1}).model_copy(update={"environment": env_old}) for _ in range(2)]
    new = _doc(kernel={"hits": 1, "misses": 3}).model_copy(update={"environment": env_new})
    f = tmp_path / "fleet"
    f.mkdir()
    for d in [*old, new]:
        write_stats(f / f"kcache-stats-node-{id(d)}.json", d)  # one file per process, merged when read
    merged = load_stats(f)
    assert [e.model_dump() for e in merged.environments] == [
        {"torch": "2.15.0", "triton": "3.9.0", "processes": 1, "hits": 1, "misses": 3, "errors": 0, "hit_rate": 25.0},
        {"torch": "2.13.0", "triton": "3.9.0", "processes": 2, "hits": 18, "misses": 2, "errors": 0, "hit_rate": 90.0},
    ]
    assert StatsDocument.merge([merged, new]).environments[0].processes == 2  # merging again adds up
    rc, out, _ = run_cli(capsys, "--file", str(f))
    assert rc == 0
    rows = out.split("Per environment (torch, triton)\n", 1)[1].splitlines()
    assert rows[1].split() == ["torch", "2.15.0,", "triton", "3.9.0", "1", "1", "3", "0", "25.0%"]
    assert rows[2].split() == ["torch", "2.13.0,", "triton", "3.9.0", "2", "18", "2", "0", "90.0%"]
    assert "torch 2.13.0, triton 3.9.0: 90.0% (2 processes)" in format_markdown(merged)
    report = RunStatsReport.model_validate_json(run_report(new).model_dump_json())
    assert report.environment is not None and report.environment.torch == "2.15.0"


def test_runtime_close_reports_only_when_kcache_did_something(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kcache.config import ClientConfig
    from kcache.current import ensure_runtime, stop_runtime

    stats_file = tmp_path / "rt.json"
    cfg = ClientConfig(url=None, stats_file=str(stats_file), report=True, workload="bert", run_id="ci-9")
    ensure_runtime(cfg)
    stop_runtime()  # idle: no file, no line
    assert not stats_file.exists() and "kcache:" not in capsys.readouterr().err
    rt = ensure_runtime(cfg)
    rt.stats.miss("fx-graph", "not_found")
    stop_runtime()
    rt.close()  # idempotent: reports once
    assert capsys.readouterr().err.count("kcache: 0 hits, 1 misses, 0 errors (0.0% hit rate) | fx-graph 0/1") == 1
    doc = load_stats(stats_file)
    assert doc.processes == 1 and doc.workload == "bert" and doc.run_id == "ci-9"
    import torch

    # The fingerprint at exit names this process's torch: the file shows it per environment.
    assert [(e.torch, e.processes, e.misses) for e in doc.environments] == [(torch.__version__, 1, 1)]


# ---- kcache stats formats and --fail-under --------------------------------------------------------


def test_formats_and_fail_under(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.json"
    write_stats(f, _doc(kernel={"hits": 8, "misses": 1, "errors": 1}, autotune={"puts": 2}))
    rc, out, err = run_cli(capsys, "--file", str(f), "--fail-under", "80")
    assert rc == 0 and "Hit rate (hits / lookups)" in out and "80.0%" in out and err == ""
    rc, out, err = run_cli(capsys, "--file", str(f), "--fail-under", "80.1")
    assert rc == 2 and "FAIL" in out and "hit rate 80.0% is below --fail-under 80.1%" in err
    rc, out, _ = run_cli(capsys, "--file", str(f), "--format", "json")
    body = json.loads(out)
    assert rc == 0 and body["hit_rate"] == 80.0 and body["totals"]["errors"] == 1 and body["layers"]["kernel"]["misses"] == 1
    md = format_markdown(load_stats(f), 90)
    assert md.startswith("### kcache: 80.0% hit rate ❌ below the 90% bar")
    assert "| kernel | 8 | 1 | 1 | 10 | 80.0% |" in md and "**1 errors**" in md
    suite = ET.fromstring(format_junit(load_stats(f), 90))
    assert suite.tag == "testsuite" and suite.get("name") == "kcache"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"overall", "kernel", "autotune"}
    assert cases["kernel"].find("failure") is not None and cases["overall"].find("failure") is not None
    assert cases["autotune"].find("skipped") is not None  # uploads only: no lookups to rate
    assert suite.get("failures") == "2" and suite.get("skipped") == "1" and suite.get("tests") == "3"
    assert ET.fromstring(format_junit(load_stats(f), None)).get("failures") == "0"
    out_file = tmp_path / "junit.xml"
    rc, out, _ = run_cli(capsys, "--file", str(f), "--format", "junit", "--fail-under", "50", "-o", str(out_file))
    assert rc == 0 and out == "" and ET.parse(out_file).getroot().get("failures") == "0"


def test_nothing_to_read_and_no_lookups(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KCACHE_STATS_FILE", raising=False)
    monkeypatch.delenv("KCACHE_RUN_ID", raising=False)
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path / "local"))  # no stats of this machine yet
    assert run_cli(capsys, "--file", str(tmp_path / "missing.json"))[0] == 1
    assert run_cli(capsys)[0] == 1
    f = tmp_path / "empty.json"
    write_stats(f, _doc())
    rc, _out, err = run_cli(capsys, "--file", str(f), "--fail-under", "1")
    assert rc == 2 and "no lookups" in err  # kcache never ran a lookup: not a pass
    monkeypatch.setenv("KCACHE_STATS_FILE", str(f))
    assert run_cli(capsys)[0] == 0  # the env var is the default source


# ---- injected errors: the service is down ---------------------------------------------------------

_DOWN_JOB = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from kcache.config import ClientConfig
    from kcache.current import ensure_runtime
    rt = ensure_runtime(ClientConfig.from_env())
    for key in sys.argv[2:]:
        assert rt.fetch_kernel(key, Path(sys.argv[1])) is None
    assert rt.get_entry("fx-graph", "pt2-graph-key") is None
    """
)


def test_service_down_shows_errors_not_misses_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = ["A" * 52, "B" * 52, "C" * 52]
    stats_file = tmp_path / "down.json"
    env = client_env(tmp_path, KCACHE_URL=f"http://127.0.0.1:{closed_port()}", KCACHE_STATS_FILE=str(stats_file),
                     KCACHE_REPORT="1", KCACHE_RUN_ID="down-1")
    out = subprocess.run([sys.executable, "-c", _DOWN_JOB, str(tmp_path / "triton"), *keys], env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("kcache: "))
    assert line.startswith("kcache: 0 hits, 0 misses, 4 errors (0.0% hit rate) | fx-graph 0/1 (1 errors) | kernel 0/3 (3 errors)")
    doc = load_stats(stats_file)
    assert doc.layers["kernel"].errors == 3 and doc.layers["kernel"].misses == 0
    assert doc.layers["kernel"].error_kinds == {"ServiceUnavailable": 3}

    rc, text, _ = run_cli(capsys, "--file", str(stats_file), "--fail-under", "50")
    assert rc == 2
    assert "  misses" in text and [ln.split()[-1] for ln in text.splitlines() if ln.startswith("  misses")] == ["0"]
    assert [ln.split()[-1] for ln in text.splitlines() if ln.startswith("  errors")] == ["4"]
    assert "kernel: ServiceUnavailable x3" in text
    body = json.loads(run_cli(capsys, "--file", str(stats_file), "--format", "json")[1])
    assert body["totals"]["errors"] == 4 and body["totals"]["misses"] == 0 and body["hit_rate"] == 0.0
    md = run_cli(capsys, "--file", str(stats_file), "--format", "markdown")[1]
    assert "**0** hits, **0** misses, **4** errors" in md and "| kernel | 0 | 0 | 3 | 3 | 0.0% |" in md
    suite = ET.fromstring(run_cli(capsys, "--file", str(stats_file), "--format", "junit", "--fail-under", "50")[1])
    kernel = next(c for c in suite.iter("testcase") if c.get("name") == "kernel")
    props = {p.get("name"): p.get("value") for p in kernel.iter("property")}
    assert props["errors"] == "3" and props["misses"] == "0"
    assert kernel.find("failure") is not None and "0 misses, 3 errors" in (kernel.find("failure").text or "")


@pytest.mark.slow
def test_backend_outage_reaches_the_run_aggregate_as_errors(live_service, real_kernel_dirs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """The service is up but its blob store is down: lookups answer 503, the client counts errors,
    and its run report (which needs only the index) still arrives."""
    from kcache_schemas.pack import pack_kernel_dir
    from kcache_server.storage import BackendUnavailable

    key = real_kernel_dirs[0].name
    assert httpx.put(f"{live_service.url}/v1/default/kernels/{key}", content=pack_kernel_dir(real_kernel_dirs[0])[1], timeout=HANG_S).status_code == 201
    store = live_service.server.config.app.state.store

    def down(*_a: object) -> bytes:
        raise BackendUnavailable("file-blobs", "injected outage")

    store.blobs.get = store.blobs.open = down
    env = client_env(tmp_path, KCACHE_URL=live_service.url, KCACHE_RUN_ID="outage-1", KCACHE_REPORT="1")
    out = subprocess.run([sys.executable, "-c", _DOWN_JOB, str(tmp_path / "triton"), key], env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    assert "kcache: 0 hits, 1 misses, 1 errors" in out.stderr  # the fx-graph entry is a real miss
    rc, text, _ = run_cli(capsys, "--run", "outage-1", "--url", live_service.url, "--format", "json")
    run = json.loads(text)
    assert rc == 0 and run["processes"] == 1
    assert run["layers"]["kernel"]["errors"] == 1 and run["layers"]["kernel"]["misses"] == 0
    assert run["layers"]["fx-graph"]["misses"] == 1 and run["layers"]["fx-graph"]["errors"] == 0


# ---- a real job, twice ---------------------------------------------------------------------------

_JOB = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import kcache
    from kcache.current import get_runtime
    mode, url, src = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    assert kcache.install(url=url)
    rt = get_runtime()
    dest = Path(os.environ["TRITON_CACHE_DIR"])
    dest.mkdir(parents=True, exist_ok=True)
    keys = sorted(p.name for p in src.iterdir() if len(p.name) == 52)
    # What a Triton cache manager does on a local miss: ask kcache, emit into the empty cache dir.
    got = [k for k in keys if rt.fetch_kernel(k, dest) is not None]
    if mode == "cold":
        # Nothing came back, so "compile" (the kernels in src) and let Inductor's real
        # TritonBundler collect them; kcache's hooks upload them in the background.
        from torch._inductor import config
        from torch._inductor.triton_bundler import TritonBundler
        os.environ["TRITON_CACHE_DIR"] = str(src)
        with config.patch(bundle_triton_into_fx_graph_cache=True):
            TritonBundler.begin_compile()
            for k in keys:
                TritonBundler.put(k, 0)
            TritonBundler.collect()
    print(json.dumps({"fetched": len(got), "emitted": sorted(p.name for p in dest.iterdir() if len(p.name) == 52)}))
    """
)


@pytest.mark.slow
@pytest.mark.torch
def test_a_job_twice_cold_then_warm(live_service, real_kernel_dirs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    src = real_kernel_dirs[0].parent
    n = len(real_kernel_dirs)
    url = live_service.url

    def job(mode: str, run_id: str, rank: int, stats: Path) -> subprocess.Popen[str]:
        env = client_env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / f"{run_id}-rank{rank}"), KCACHE_RUN_ID=run_id,
                         KCACHE_STATS_FILE=str(stats), KCACHE_REPORT="1")
        return subprocess.Popen([sys.executable, "-c", _JOB, mode, url, str(src)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def finish(p: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
        out, err = p.communicate(timeout=HANG_S)
        assert p.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1]), err

    # Run 1, cold: every lookup misses, then the bundler uploads; stats into a directory.
    run1_dir = tmp_path / "run1-stats"
    run1_dir.mkdir()
    result, err = finish(job("cold", "ci-1", 0, run1_dir))
    assert result == {"fetched": 0, "emitted": []}
    assert f"kcache: 0 hits, {n} misses, 0 errors (0.0% hit rate) | kernel 0/{n}" in err
    assert f"({n} puts)" in err
    # Run 2, warm: two ranks, each with a fresh empty TRITON_CACHE_DIR; stats merged into one file.
    run2_file = tmp_path / "run2-stats.json"
    ranks = [job("warm", "ci-2", r, run2_file) for r in range(2)]
    for p in ranks:
        result, err = finish(p)
        assert result["fetched"] == n and result["emitted"] == sorted(d.name for d in real_kernel_dirs)
        assert f"kcache: {n} hits, 0 misses, 0 errors (100.0% hit rate) | kernel {n}/{n}" in err

    # The local stats files.
    local1, local2 = load_stats(run1_dir), load_stats(run2_file)
    assert local1.layers["kernel"].misses == n and local1.layers["kernel"].puts == n
    assert local2.processes == 2 and local2.layers["kernel"].hits == 2 * n and local2.layers["kernel"].bytes_down > 0

    # The service aggregated each run over its processes.
    runs = httpx.get(f"{url}/v1/default/runs", timeout=HANG_S).json()["items"]
    assert [r["run_id"] for r in runs] == ["ci-2", "ci-1"]  # newest first
    assert runs[0]["processes"] == 2 and runs[0]["hits"] == 2 * n and runs[0]["hit_rate"] == 100.0
    assert runs[1]["misses"] == n and runs[1]["hit_rate"] == 0.0 and runs[1]["puts"] == n

    # kcache stats --fail-under: run 2 passes, run 1 fails (exit 2).
    rc, text, err = run_cli(capsys, "--run", "ci-1", "--url", url, "--fail-under", "80")
    assert rc == 2 and "run ci-1" in text and "is below --fail-under 80%" in err
    rc, text, _ = run_cli(capsys, "--run", "ci-2", "--url", url, "--fail-under", "80")
    assert rc == 0 and "run ci-2" in text and "2 processes" in text
    # The same gate from the local stats of each run.
    assert run_cli(capsys, "--file", str(run1_dir), "--fail-under", "80")[0] == 2
    assert run_cli(capsys, "--file", str(run2_file), "--fail-under", "80")[0] == 0
    # Markdown for a CI step summary.
    md = run_cli(capsys, "--run", "ci-2", "--url", url, "--format", "markdown", "--fail-under", "80")[1]
    assert md.startswith("### kcache: 100.0% hit rate ✅ at or above the 80% bar")
    assert f"| kernel | {2 * n} | 0 | 0 | {2 * n} | 100.0% |" in md
    # JUnit, through the real console entry point, parsed as XML.
    for run_id, failures in (("ci-1", "2"), ("ci-2", "0")):
        xml_file = tmp_path / f"{run_id}.xml"
        cli = subprocess.run([sys.executable, "-m", "kcache.cli", "stats", "--run", run_id, "--url", url, "--format", "junit",
                              "--fail-under", "80", "-o", str(xml_file)], env=client_env(tmp_path), capture_output=True, text=True, timeout=HANG_S)
        assert cli.returncode == (2 if run_id == "ci-1" else 0), cli.stderr
        suite = ET.parse(xml_file).getroot()
        assert suite.tag == "testsuite" and suite.get("failures") == failures
        assert {c.get("name") for c in suite.iter("testcase")} == {"overall", "kernel"}
        suite_props = suite.find("properties")
        assert suite_props is not None
        props = {p.get("name"): p.get("value") for p in suite_props}
        assert props["run_id"] == run_id and props["fail_under"] == "80"
