"""Run statistics API, dashboard queries, and the web dashboard at /ui in a real headless Chromium.

The browser test needs Debian's ``chromium`` (``apt-get install -y chromium``) and Playwright for
Python (``pip install playwright``; never ``playwright install``: it would download a browser).
Without them it skips, except under ``CI=true`` (or ``KCACHE_TEST_BROWSER=require``), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from kcache_schemas.pack import pack_kernel_dir, read_pack
from kcache_server.app import create_app
from kcache_server.settings import Settings

from kcache_testkit.pace import HANG_S

pytest_plugins = ["live"]


def _patient(page: Any) -> Any:
    """``page`` with its waits (actions, locators, ``expect``) as hang guards, not bounds:
    chromium renders far slower on a loaded machine than playwright's 5 and 30 s defaults allow."""
    from playwright.sync_api import expect

    page.set_default_timeout(HANG_S * 1000)
    expect.set_options(timeout=HANG_S * 1000)
    return page

READ_TOKEN = "dash-read-token-0123456789"
WRITE_TOKEN = "dash-write-token-0123456789"
TOKENS = json.dumps([
    {"token": READ_TOKEN, "name": "reader", "scopes": ["read"]},
    {"token": WRITE_TOKEN, "name": "writer", "scopes": ["write"]},
])
CHROMIUM = os.environ.get("KCACHE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def report(report_id: str, *, workload: str | None = "bert", ended: float, pid: int = 1, torch: str = "2.13.0",
           run_source: str | None = None, **kernel: Any) -> dict[str, Any]:
    return {"report_id": report_id, "host": "node-1", "pid": pid, "workload": workload, "run_source": run_source, "started_at": max(0.0, ended - 60),
            "ended_at": ended, "environment": {"torch": torch, "triton": "3.9.0", "cuda": "13.0", "gpu_arch": "sm_90"},
            "layers": {"kernel": {"bytes_down": 1000 * kernel.get("hits", 0), **kernel},
                       "fx-graph": {"hits": 1, "saved_s": 12.5}}}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "svc", access_flush_s=0.05))) as c:
        yield c


# ---- the runs API --------------------------------------------------------------------------------


def test_runs_aggregate_over_processes_and_list_newest_first(client: TestClient) -> None:
    now = time.time()
    ok = client.post("/v1/default/runs/ci-100/stats", json=report("rank0-aaaaaaaa", ended=now - 100, hits=3, misses=1))
    assert ok.status_code == 201 and ok.json()["report"] == "node-1-1-rank0-aaaaaaaa"
    # A retried POST (same report id) is stored once.
    assert client.post("/v1/default/runs/ci-100/stats", json=report("rank0-aaaaaaaa", ended=now - 100, hits=3, misses=1)).status_code == 200
    body = report("rank1-bbbbbbbb", ended=now - 90, pid=2, hits=2, errors=2)
    body["layers"]["kernel"]["miss_reasons"] = {}
    body["layers"]["kernel"]["error_kinds"] = {"ServiceUnavailable": 2}
    body["future_field"] = "ignored"  # a newer client's extra field must not cost it its stats
    assert client.post("/v1/default/runs/ci-100/stats", json=body).status_code == 201
    assert client.post("/v1/default/runs/ci-101/stats", json=report("r-cccccccc", workload="resnet", ended=now, hits=5, run_source="SLURM_JOB_ID")).status_code == 201

    run = client.get("/v1/default/runs/ci-100").json()
    assert run["processes"] == 2 and run["workload"] == "bert"
    assert (run["hits"], run["misses"], run["errors"]) == (5 + 2, 1, 2)  # fx-graph hit per process counts too
    assert run["hit_rate"] == pytest.approx(100 * 7 / 10)
    assert run["layers"]["kernel"]["errors"] == 2 and run["layers"]["kernel"]["misses"] == 1
    assert run["layers"]["kernel"]["error_kinds"] == {"ServiceUnavailable": 2}
    assert run["environments"] == [
        {"torch": "2.13.0", "triton": "3.9.0", "processes": 2, "hits": 7, "misses": 1, "errors": 2, "hit_rate": pytest.approx(70.0)}
    ]
    assert run["saved_s"] == 25.0 and run["started_at"] == pytest.approx(now - 160) and run["ended_at"] == pytest.approx(now - 90)

    runs = client.get("/v1/default/runs").json()["items"]
    assert [r["run_id"] for r in runs] == ["ci-101", "ci-100"] and "layers" not in runs[0]
    # Where each id came from, as its processes said (older clients say nothing).
    assert [r["run_source"] for r in runs] == ["SLURM_JOB_ID", None]
    assert [r["run_id"] for r in client.get("/v1/default/runs?workload=bert").json()["items"]] == ["ci-100"]
    assert [r["run_id"] for r in client.get("/v1/default/runs?limit=1").json()["items"]] == ["ci-101"]
    assert client.get("/v1/other-ns/runs").json()["items"] == []  # runs are per namespace
    assert client.get("/v1/default/runs/nope").status_code == 404


def test_bad_run_reports_are_refused(client: TestClient) -> None:
    assert client.post("/v1/default/runs/bad%20id/stats", json=report("r-aaaaaaaa", ended=1)).status_code == 400
    r = client.post("/v1/default/runs/ci-1/stats", json={"report_id": "short"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert client.post("/v1/default/runs/ci-1/stats", json=report("r-aaaaaaaa", ended=1, hits=-1)).status_code == 422
    assert client.post("/v1/default/runs/ci-1/stats", json=report("r-aaaaaaaa", ended=1, run_source="a variable?")).status_code == 422
    bad_layer = {"report_id": "r-aaaaaaaa", "layers": {"Bad Layer!": {}}}
    assert client.post("/v1/default/runs/ci-1/stats", json=bad_layer).status_code == 422
    assert client.post("/v1/default/runs/ci-1/stats", content=b"{not json").status_code == 422
    assert client.post("/v1/default/runs/ci-1/stats", content=b"x" * (2 << 20)).status_code == 413


def test_top_kernels_usage_and_namespaces(client: TestClient, real_kernel_dirs: list[Path]) -> None:
    packs = {d.name: pack_kernel_dir(d)[1] for d in real_kernel_dirs}
    for key, pack in packs.items():
        assert client.put(f"/v1/team-a/kernels/{key}", content=pack).status_code == 201
    hot = sorted(packs)[1]
    for _ in range(3):
        client.get(f"/v1/team-a/kernels/{hot}")
    client.app.state.store.access.flush()  # type: ignore[attr-defined]
    by_size = client.get("/v1/team-a/stats/top?by=size&limit=2").json()
    assert by_size["scanned"] == len(packs)
    assert [i["key"] for i in by_size["items"]] == sorted(packs, key=lambda k: (len(packs[k]), k), reverse=True)[:2]
    item = by_size["items"][0]
    assert item["target"] == "cuda:90" and item["pack_size"] == len(packs[item["key"]]) and item["total_size"] > item["pack_size"]
    by_hits = client.get("/v1/team-a/stats/top?by=hits").json()["items"]
    assert by_hits[0]["key"] == hot and by_hits[0]["hits"] == 3
    assert client.get("/v1/team-a/stats/top?by=bogus").status_code == 422
    assert client.post("/v1/team-a/runs/ci-1/stats", json=report("r-aaaaaaaa", ended=1)).status_code == 201
    usage = client.get("/v1/team-a/stats/usage").json()
    assert usage["kinds"]["kernel"] == {"entries": len(packs), "bytes": sum(map(len, packs.values()))}
    assert usage["kinds"]["run"]["entries"] == 2  # the report and the run's marker, folded into "run"
    assert client.get("/v1/namespaces").json()["items"] == ["team-a"]


def test_run_stats_and_dashboard_respect_auth(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path / "svc", tokens=TOKENS))) as c:
        body = report("r-aaaaaaaa", ended=1, hits=1)
        assert c.post("/v1/default/runs/ci-1/stats", json=body).status_code == 401
        assert c.post("/v1/default/runs/ci-1/stats", json=body, headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 403
        assert c.post("/v1/default/runs/ci-1/stats", json=body, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}).status_code == 201
        assert c.get("/v1/default/runs").status_code == 401
        assert c.get("/v1/default/runs", headers={"Authorization": f"Bearer {READ_TOKEN}"}).json()["items"][0]["run_id"] == "ci-1"
        assert c.get("/v1/namespaces").status_code == 401
        assert c.get("/v1/namespaces", headers={"Authorization": f"Bearer {READ_TOKEN}"}).json()["items"] == ["default"]
        page = c.get("/ui")  # the page holds no data: it loads without a token, the API does not
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert c.get("/ui/static/app.js").headers["content-type"].startswith("text/javascript")
        assert c.get("/ui/static/app.css").status_code == 200
        for bad in ("..%2Fapp.py", ".hidden.js", "nope.js", "index.py"):
            assert c.get(f"/ui/static/{bad}").status_code == 404


# ---- the dashboard in Chromium -------------------------------------------------------------------


def png_stats(data: bytes) -> tuple[int, int, int, float]:
    """(width, height, distinct colours, share of pixels unlike the most common colour) of an
    8-bit RGB/RGBA PNG, decoded by hand so the test needs no imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if ctype == b"IHDR":
            width, height, depth, color, _c, _f, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and color in (2, 6) and interlace == 0
            bpp = 3 if color == 2 else 4
        elif ctype == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    counts: dict[bytes, int] = {}
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        prev = line
        for x in range(0, stride, bpp * 4):  # every 4th pixel is plenty
            px = bytes(line[x : x + 3])
            counts[px] = counts.get(px, 0) + 1
    total = sum(counts.values())
    return width, height, len(counts), 1 - max(counts.values()) / total


def _browser_or_skip() -> Any:
    required = os.environ.get("CI") == "true" or os.environ.get("KCACHE_TEST_BROWSER") == "require"
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "Playwright for Python is missing: pip install playwright (never `playwright install`)"
    if problem is None and not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        problem = f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium"
    if problem:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)
    return sync_playwright


@pytest.mark.slow
def test_dashboard_in_chromium(tmp_path: Path, real_kernel_dirs: list[Path]) -> None:
    from live import LiveService

    sync_playwright = _browser_or_skip()
    from kcache.config import ClientConfig
    from kcache.transport.entry_signing import EntrySigning, generate_key_pair
    from playwright.sync_api import expect

    write = {"Authorization": f"Bearer {WRITE_TOKEN}"}
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    pem, public_line, key_id = generate_key_pair("dashboard-producer")
    (tmp_path / "producer.key").write_bytes(pem)
    signing = EntrySigning.from_config(ClientConfig(signing_private_key=str(tmp_path / "producer.key"), run_id="nightly-7"))
    assert signing is not None
    entry_key = "pt2:fx-graph-v1::fdashboard0123:c1"
    retention = json.dumps({"default": {"soft_limit": "1MB", "hard_limit": "2MB", "ttl": "30d"}, "gc_interval": "1h"})
    with LiveService(tmp_path / "svc", tokens=TOKENS, producer_keys=json.dumps({"default": [public_line]}), retention=retention) as svc:
        signed = signing.seal("fx-graph", entry_key, b"a pickled graph")
        assert httpx.put(f"{svc.url}/v1/default/entries/fx-graph/{entry_key}", content=signed, headers=write, timeout=HANG_S).status_code == 201
        packs = {d.name: pack_kernel_dir(d)[1] for d in real_kernel_dirs}
        for key, pack in packs.items():
            assert httpx.put(f"{svc.url}/v1/default/kernels/{key}", content=pack, headers=write, timeout=HANG_S).status_code == 201
        keys = sorted(packs)
        # A key a node's canary found unsound (kcache.layers.key_canary): listed with what differed and the suspects.
        from kcache_schemas.key_diff import Change, KeyComponents
        from kcache_schemas.unsound_reports import UnsoundReport

        recorded = KeyComponents(layer="kernel", key=keys[0])
        unsound = UnsoundReport(layer="kernel", key=keys[0], compared="kernel files", served_digest="a" * 64, own_digest="b" * 64,
                                output_diff=["--- served/scale.ttgir", "+++ own/scale.ttgir"], producer=recorded, consumer=recorded,
                                suspects=[Change(name="options[num_warps]", stored="4", wanted="8")])
        assert httpx.put(f"{svc.url}/v1/default/unsound/kernel/{keys[0]}", content=unsound.model_dump_json(), headers=write, timeout=HANG_S).status_code == 201
        for _ in range(2):
            assert httpx.get(f"{svc.url}/v1/default/kernels/{keys[0]}", headers=read, timeout=HANG_S).status_code == 200
        now = time.time()
        runs = [
            ("ci-1", report("rank0-aaaaaaaa", ended=now - 7200, hits=2, misses=6)),
            ("ci-1", report("rank1-bbbbbbbb", ended=now - 7100, pid=2, torch="2.15.0", hits=1, misses=7)),
            ("ci-2", report("rank0-cccccccc", ended=now - 3600, hits=15, misses=1, errors=2, error_kinds={"ServiceUnavailable": 2})),
            # A job that set no KCACHE_RUN_ID: its id is its GitHub Actions job's (kcache.host.launchers).
            ("gh-900-1-test", report("rank0-dddddddd", workload="resnet", ended=now - 600, hits=9, misses=1, run_source="GITHUB_RUN_ID")),
        ]
        runs[2][1]["run_source"] = "KCACHE_RUN_ID"  # ci-2's process named its run; ci-1's are older clients that do not say
        # ci-2's process also sent its phase timers, a post-install finding and a miss.
        runs[2][1].update(phases={"_compile.compile_inner": 3.5, "bytecode_tracing": 2.0, "async_compile.wait": 0.5},
                          verification={"fetched_unused": {"fx-graph: prefetched, never asked for": 2}},
                          missed=[{"layer": "fx-graph", "key": "fmissed0123", "reason": "not_found"}])
        for run_id, body in runs:
            assert httpx.post(f"{svc.url}/v1/default/runs/{run_id}/stats", json=body, headers=write, timeout=HANG_S).status_code == 201
        svc.server.config.app.state.store.access.flush()  # the two reads count for "top hits" now, not at the next flush

        console: list[str] = []
        failed: list[tuple[int, str]] = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                # The page runs under its own CSP (no eval): waits use locators, not wait_for_function.
                page = _patient(browser.new_page(viewport={"width": 1280, "height": 1000}, accept_downloads=True))
                page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" and "Failed to load resource" not in m.text else None)
                page.on("response", lambda r: failed.append((r.status, r.url.removeprefix(svc.url))) if r.status >= 400 else None)
                page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
                page.goto(f"{svc.url}/ui")
                # No token yet: the page says so instead of showing empty data.
                expect(page.locator("#status")).to_contain_text("needs a token")
                page.fill("#token", READ_TOKEN)
                page.click("#auth button[type=submit]")
                page.wait_for_selector("body[data-loaded='1']")

                # Hit rate over time: a real SVG chart with a point per run and a line per workload.
                points = page.locator("#hitrate-svg circle.point")
                assert points.count() == 3
                assert page.locator("#hitrate-svg polyline.series").count() == 1  # bert has 2 runs, resnet 1
                assert page.locator("#hitrate-svg rect.error-bar").count() == 1  # ci-2 had errors
                ys = {points.nth(i).get_attribute("data-run"): float(points.nth(i).get_attribute("cy") or 0) for i in range(3)}
                assert ys["ci-1"] > ys["ci-2"] > ys["gh-900-1-test"]  # 27.8% < 84.2% < 90.9%; SVG y grows downwards
                assert set(page.locator("#legend").inner_text().split()) >= {"bert", "resnet"}
                # Recent runs, newest first; a click shows per-layer detail with errors apart.
                rows = page.locator("#runs-table tbody tr")
                assert rows.count() == 3 and rows.nth(0).get_attribute("data-run") == "gh-900-1-test"
                # Where each run id came from: the launcher's variable, KCACHE_RUN_ID, or not said.
                assert [rows.nth(i).locator("td").nth(1).inner_text() for i in range(3)] == ["GITHUB_RUN_ID", "KCACHE_RUN_ID", "\u2013"]
                assert rows.nth(2).locator("td").nth(5).inner_text() == "2"  # ci-1: two processes
                # ci-1 ran mid-upgrade: one rank on each torch, each with its own hit rate.
                assert rows.nth(2).locator("td").nth(3).inner_text() == "torch 2.15.0, triton 3.9.0; torch 2.13.0, triton 3.9.0"
                rows.nth(2).click()
                envs = page.locator("#run-environments tbody tr")
                expect(envs).to_have_count(2)
                assert envs.nth(0).inner_text().split("\t") == ["torch 2.15.0, triton 3.9.0", "1", "2", "7", "0", "22.2%"]
                assert envs.nth(1).inner_text().split("\t") == ["torch 2.13.0, triton 3.9.0", "1", "3", "6", "0", "33.3%"]
                rows.nth(1).click()
                # The detail of the run clicked before is on the page until this one's arrives:
                # wait for this run's content, not for the table.
                expect(page.locator("#run-layers")).to_contain_text("ServiceUnavailable \u00d72")
                expect(page.locator("#run-layers tbody tr")).to_have_count(2)
                phases = page.locator("#run-phases tbody tr")
                expect(phases).to_have_count(2)  # grouped: Dynamo (its outermost timer), kernel compiles
                assert phases.nth(0).inner_text().split("\t") == ["Dynamo", "3.50"]
                assert phases.nth(1).inner_text().split("\t") == ["kernel compiles (Triton, C++)", "0.50"]
                expect(page.locator("#run-verification")).to_contain_text("fx-graph: prefetched, never asked for")
                expect(page.locator("#run-missed")).to_contain_text("kcache explain --run ci-2")
                unsound_rows = page.locator("#unsound-table tbody tr.unsound-row")
                expect(unsound_rows).to_have_count(1)
                assert "options[num_warps]: 4 \u2192 8" in unsound_rows.inner_text() and "scale.ttgir" in unsound_rows.inner_text()
                # Storage usage and top kernels.
                usage = page.locator("#usage-table").inner_text()
                assert "kernel" in usage and "run" in usage
                budget = page.locator("#budget").inner_text()  # the namespace's budget and rules
                assert f"({len(packs) + 1}) of 1.0 MB soft / 2.0 MB hard" in budget and "TTL 30.0 d" in budget  # + the signed entry
                assert "No GC has run" in budget
                assert page.locator("#top-table tbody tr").count() == len(packs)
                page.click("#top-hits-btn")
                expect(page.locator("#top-table tbody tr a").first).to_have_attribute("title", keys[0])
                page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

                # Kernel browser: search by prefix, open a kernel, read its PTX, download its pack.
                page.fill("#q", keys[1][:5].lower())
                page.click("#search button")
                page.wait_for_selector(f"#results a[data-key='{keys[1]}']")
                page.click(f"#results a[data-key='{keys[1]}']")
                page.wait_for_selector("#files-table")
                manifest = page.locator("dl.manifest").inner_text()
                assert keys[1] in manifest and "cuda arch 90" in manifest
                page.click("button.view-file[data-file$='.ptx']")
                expect(page.locator("#file-view")).to_contain_text(".version")
                ptx = page.locator("#file-view").inner_text()
                assert ".target sm_90" in ptx
                with page.expect_download() as dl:
                    page.click("#download")
                saved = tmp_path / "download.kpack"
                dl.value.save_as(saved)
                assert saved.read_bytes() == packs[keys[1]]
                assert read_pack(saved.read_bytes())[0].key == keys[1]
                page.locator("#kernel").scroll_into_view_if_needed()
                page.screenshot(path=str(tmp_path / "kernel-ptx.png"), full_page=True)
                page.locator("#browser").screenshot(path=str(tmp_path / "kernel-browser.png"))

                # A cache entry: who signed it, with the provenance they signed, checked by the
                # service against the key registered for the namespace.
                page.select_option("#entry-layer", "fx-graph")
                page.fill("#entry-key", entry_key)
                page.click("#entry-search button")
                page.wait_for_selector("#entry-info")
                info = page.locator("#entry-info").inner_text()
                assert f"ed25519 key {key_id}" in info and "nightly-7" in info and socket.gethostname() in info
                assert "torch " in info and "checked by the service" in page.locator("#entry-verdict").inner_text()
                page.locator("#entries").screenshot(path=str(tmp_path / "entry.png"))
                page.fill("#entry-key", "pt2:fx-graph-v1::absent:c1")
                page.click("#entry-search button")
                expect(page.locator("#entry")).to_contain_text("No fx-graph entry")
            finally:
                browser.close()
    assert not console, console  # no script errors, no CSP violations
    # Only the first call, before the token was given, and the entry looked up that is not there.
    assert failed == [(401, "/v1/namespaces"), (404, "/v1/default/entries/fx-graph/pt2%3Afx-graph-v1%3A%3Aabsent%3Ac1/info")], failed
    for name in ("dashboard.png", "kernel-ptx.png", "kernel-browser.png", "entry.png"):
        width, height, colours, ink = png_stats((tmp_path / name).read_bytes())
        assert width >= 600 and height >= 150, (name, width, height)
        assert colours > 20 and ink > 0.05, (name, colours, ink)  # not blank


# ---- /docs offline ---------------------------------------------------------------------------------


def test_api_docs_reference_only_assets_the_service_serves(client: TestClient) -> None:
    """Swagger UI comes from the package, not cdn.jsdelivr.net (before: a blank page offline)."""
    import re

    page = client.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", page.text)
    assert urls and all(u.startswith("/") for u in urls), urls  # nothing from another origin
    assert "//" not in "".join(urls) and "cdn" not in page.text and "tiangolo" not in page.text
    for u in urls:
        r = client.get(u)
        assert r.status_code == 200 and r.content, u
    assert client.get("/docs/static/README.md").status_code == 404  # only the assets themselves
    assert client.get("/redoc").status_code == 404  # CDN-only: off rather than blank


@pytest.mark.slow
def test_api_docs_render_in_chromium_with_no_network(tmp_path: Path) -> None:
    """Every request to another origin is refused: Swagger UI still lists the operations."""
    sync_playwright = _browser_or_skip()
    from live import LiveService
    from playwright.sync_api import expect

    with LiveService(tmp_path / "svc") as svc, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = _patient(browser.new_page())
            foreign: list[str] = []

            def offline(route: Any) -> None:
                if route.request.url.startswith(svc.url):
                    route.continue_()
                else:
                    foreign.append(route.request.url)
                    route.abort()

            page.route("**/*", offline)
            page.goto(f"{svc.url}/docs")
            expect(page.locator(".opblock").first).to_be_visible()
            assert page.locator(".opblock").count() > 20
            assert foreign == []
        finally:
            browser.close()


@pytest.mark.slow
def test_chart_time_labels_are_as_fine_as_the_runs_need_and_never_repeat(tmp_path: Path) -> None:
    """Before: runs minutes apart got six x-axis labels that all read one "MM-DD HH:MM"."""
    from live import LiveService

    sync_playwright = _browser_or_skip()
    with LiveService(tmp_path / "svc") as svc:
        now = time.time()
        for i, ago in enumerate((170, 110, 50)):  # three runs within three minutes
            body = report(f"r{i}-aaaaaaaa", ended=now - ago, hits=i + 1, misses=1)
            assert httpx.post(f"{svc.url}/v1/default/runs/ci-{i}/stats", json=body, timeout=HANG_S).status_code == 201
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = _patient(browser.new_page())
                page.goto(f"{svc.url}/ui")
                page.wait_for_selector("body[data-loaded='1']")
                labels = page.locator("#hitrate-svg text.tick").all_text_contents()
            finally:
                browser.close()
    assert len(labels) == 3 and len(set(labels)) == 3, labels
    assert all(len(label) == 8 and label.count(":") == 2 for label in labels), labels  # HH:MM:SS
