"""Prometheus ``/metrics``: it parses, and its numbers move as requests happen (real kernels)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from kcache_schemas.pack import pack_kernel_dir
from kcache_server.app import create_app
from kcache_server.kinds import collapse_usage, family
from kcache_server.settings import Settings
from kcache_server.storage import BackendUnavailable
from kcache_server.storage.base import KindUsage
from prometheus_client.parser import text_string_to_metric_families

from kcache_testkit.pace import HANG_S

pytest_plugins = ["live"]

KERNEL_ROUTE = "/v1/{namespace}/kernels/{key}"
ABSENT = "A" * 52  # a canonical key no test stores


class Scrape:
    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [s for f in self.families.values() for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(s.value for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def scrape(client: TestClient | httpx.Client) -> Scrape:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return Scrape(r.text)


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path / "svc", access_flush_s=0.1))
    with TestClient(app) as client:
        app.state.metrics.storage.ttl_s = 0  # scrape-time usage, not cached, so deltas show at once
        yield client


@pytest.fixture(scope="module")
def packs(real_kernel_dirs: list[Path]) -> list[tuple[str, bytes]]:
    return [(d.name, pack_kernel_dir(d)[1]) for d in real_kernel_dirs[:2]]


def test_metrics_move_with_lookups_bytes_and_storage(app_client: TestClient, packs: list[tuple[str, bytes]]) -> None:
    c = app_client
    (k1, p1), (k2, p2) = packs
    before = scrape(c)
    assert {"kcache_http_requests", "kcache_http_request_duration_seconds", "kcache_lookups", "kcache_bytes_received",
            "kcache_bytes_sent", "kcache_storage_bytes", "kcache_storage_entries", "kcache_backend_errors"} <= set(before.families)
    assert before.value("kcache_lookups_total", layer="kernel", result="hit") == 0

    ns = "metrics-ns"
    assert c.put(f"/v1/{ns}/kernels/{k1}", content=p1).status_code == 201
    assert c.put(f"/v1/{ns}/kernels/{k2}", content=p2).status_code == 201
    assert c.get(f"/v1/{ns}/kernels/{k1}").content == p1  # hit
    assert c.head(f"/v1/{ns}/kernels/{k2}").status_code == 200  # hit
    assert c.get(f"/v1/{ns}/kernels/{ABSENT}").status_code == 404  # miss
    assert c.head(f"/v1/{ns}/kernels/{ABSENT}").status_code == 404  # miss
    assert c.get(f"/v1/{ns}/kernels/{k1}/manifest").status_code == 200  # browsing, not a lookup
    r = c.post(f"/v1/{ns}/kernels:batch-get", json={"keys": [k1, k2, ABSENT]})  # 2 hits, 1 miss
    assert r.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r|") as tf:
        assert [m.name for m in tf] == ["index.json", f"{k1}.kpack", f"{k2}.kpack"]
    assert c.put(f"/v1/{ns}/entries/fx-graph/pt2-key-1", content=b"graph" * 100).status_code == 201
    assert c.get(f"/v1/{ns}/entries/fx-graph/pt2-key-1").status_code == 200  # fx-graph hit
    assert c.get(f"/v1/{ns}/entries/fx-graph/pt2-key-2").status_code == 404  # fx-graph miss
    assert c.get(f"/v1/{ns}/entries/made-up-layer/k").status_code == 404  # unknown layer: "other", bounded labels

    after = scrape(c)

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert delta("kcache_lookups_total", layer="kernel", result="hit") == 4  # GET + HEAD + 2 in batch
    assert delta("kcache_lookups_total", layer="kernel", result="miss") == 3  # GET + HEAD + 1 in batch
    assert delta("kcache_lookups_total", layer="fx-graph", result="hit") == 1
    assert delta("kcache_lookups_total", layer="fx-graph", result="miss") == 1
    assert delta("kcache_lookups_total", layer="other", result="miss") == 1
    assert not [s for s in after.samples if s.labels.get("layer") == "made-up-layer"]
    # Requests by route template, never by raw path.
    assert delta("kcache_http_requests_total", route=KERNEL_ROUTE, method="GET", status="200") == 1
    assert delta("kcache_http_requests_total", route=KERNEL_ROUTE, method="GET", status="404") == 1
    assert delta("kcache_http_requests_total", route=KERNEL_ROUTE, method="PUT", status="201") == 2
    assert not [s for s in after.samples if k1 in str(s.labels)]
    assert delta("kcache_http_request_duration_seconds_count", route=KERNEL_ROUTE, method="GET") == 2
    assert delta("kcache_http_request_duration_seconds_sum", route=KERNEL_ROUTE, method="GET") > 0
    # Bytes: both packs up; one pack by GET and both again in the batch stream down.
    assert delta("kcache_bytes_received_total", layer="kernel") >= len(p1) + len(p2)
    assert delta("kcache_bytes_sent_total", layer="kernel") >= 2 * len(p1) + len(p2)
    assert delta("kcache_bytes_received_total", layer="fx-graph") == 500
    # Storage from Index.usage() at scrape time.
    assert after.value("kcache_storage_entries", namespace=ns, kind="kernel") == 2
    assert after.value("kcache_storage_bytes", namespace=ns, kind="kernel") == len(p1) + len(p2)
    assert after.value("kcache_storage_entries", namespace=ns, kind="entry/fx-graph") == 1
    assert after.value("kcache_storage_bytes", namespace=ns, kind="entry/fx-graph") == 500
    assert after.value("kcache_build_info") == 1
    assert delta("kcache_backend_errors_total") == 0


def test_storage_usage_is_cached_between_scrapes(app_client: TestClient, packs: list[tuple[str, bytes]]) -> None:
    c = app_client
    c.app.state.metrics.storage.ttl_s = 3600  # type: ignore[attr-defined]
    (k1, p1), _ = packs
    assert scrape(c).value("kcache_storage_entries", namespace="cached") == 0
    assert c.put(f"/v1/cached/kernels/{k1}", content=p1).status_code == 201
    assert scrape(c).value("kcache_storage_entries", namespace="cached") == 0  # within the TTL
    c.app.state.metrics.storage.ttl_s = 0  # type: ignore[attr-defined]
    assert scrape(c).value("kcache_storage_entries", namespace="cached", kind="kernel") == 1


def test_backend_errors_are_counted_by_backend(app_client: TestClient, packs: list[tuple[str, bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    c = app_client
    (k1, p1), _ = packs
    assert c.put(f"/v1/be/kernels/{k1}", content=p1).status_code == 201
    store = c.app.state.store  # type: ignore[attr-defined]
    before = scrape(c)

    def down(*_a: object, **_k: object) -> bytes:
        raise BackendUnavailable("file-blobs", "injected outage")

    monkeypatch.setattr(store.blobs, "get", down)
    monkeypatch.setattr(store.blobs, "open", down)  # what a GET streams from
    for _ in range(2):
        r = c.get(f"/v1/be/kernels/{k1}")
        assert r.status_code == 503 and r.json()["error"]["code"] == "backend_unavailable"
    monkeypatch.setattr(store.index, "usage", down)
    after = scrape(c)  # a failed usage scrape is a backend error too, and /metrics still answers
    assert after.value("kcache_backend_errors_total", backend="file-blobs") - before.value("kcache_backend_errors_total", backend="file-blobs") == 3
    # A 503 is neither a hit nor a miss.
    for result in ("hit", "miss"):
        assert after.value("kcache_lookups_total", layer="kernel", result=result) == before.value("kcache_lookups_total", layer="kernel", result=result)
    assert after.value("kcache_http_requests_total", route=KERNEL_ROUTE, method="GET", status="503") == 2


def test_each_app_has_its_own_registry(tmp_path: Path) -> None:
    a = create_app(Settings(data_dir=tmp_path / "a"))
    b = create_app(Settings(data_dir=tmp_path / "b"))
    with TestClient(a) as ca, TestClient(b) as cb:
        for _ in range(3):
            ca.get("/healthz")
        assert scrape(ca).value("kcache_http_requests_total", route="/healthz") == 3
        assert scrape(cb).value("kcache_http_requests_total", route="/healthz") == 0


def test_metrics_over_real_http_with_streamed_batch_get(live_service, packs: list[tuple[str, bytes]]) -> None:  # type: ignore[no-untyped-def]
    (k1, p1), (k2, _p2) = packs
    with httpx.Client(base_url=live_service.url, timeout=HANG_S) as c:
        assert c.put(f"/v1/live/kernels/{k1}", content=p1).status_code == 201
        before = scrape(c)
        with c.stream("POST", "/v1/live/kernels:batch-get", json={"keys": [k1, k2]}) as r:
            body = b"".join(r.iter_bytes())
        assert r.status_code == 200 and len(body) > len(p1)
        after = scrape(c)
    assert after.value("kcache_lookups_total", layer="kernel", result="hit") - before.value("kcache_lookups_total", layer="kernel", result="hit") == 1
    assert after.value("kcache_lookups_total", layer="kernel", result="miss") - before.value("kcache_lookups_total", layer="kernel", result="miss") == 1
    assert after.value("kcache_bytes_sent_total", layer="kernel") - before.value("kcache_bytes_sent_total", layer="kernel") == len(body)


def test_helpers() -> None:
    assert family("run/ci-1") == "run" and family("workload/x") == "workload"
    assert family("entry/fx-graph") == "entry/fx-graph" and family("kernel") == "kernel"
    assert collapse_usage({"run/a": KindUsage(2, 10), "run": KindUsage(1, 5), "kernel": KindUsage(1, 1)}) == {
        "kernel": KindUsage(1, 1), "run": KindUsage(3, 15)}
