"""Outages of the production backends: the service degrades to fast 503s and heals by itself.

Two layers:

* the backends alone, against every outage shape - connection refused, a server that accepts
  and never answers (timeout), a server that resets connections, wrong credentials, a missing
  bucket, a restarted server - must raise the contract's errors within their timeout;
* a real ``kcache serve`` over a private SeaweedFS and a private Redis (never the shared ones),
  whose servers are killed (SIGKILL), frozen (SIGSTOP) and restarted: every request answers
  503 ``backend_unavailable`` within the configured timeout (never hangs, never 500), and once
  the server is back the service recovers without a restart.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import servers
from kcache_schemas.pack import MEDIA_TYPE, pack_kernel_dir
from kcache_server.storage import BackendUnavailable, IndexRecord
from kcache_server.storage.redis_index import RedisIndex
from kcache_server.storage.s3_blobs import S3AccessDenied, S3BlobStore

from kcache_testkit.pace import HANG_S, bound
from kcache_testkit.ports import free_port, wait_until
from kcache_testkit.service import ServerProcess, backend_server

pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0  # KCACHE_BACKEND_TIMEOUT_S of the service under test
# No request may take longer during an outage than the backend deadline twice (one attempt may use
# it whole after fast failures retried within it) plus the machine's pace (kcache_testkit.pace):
# about 5 s on an idle machine.
OUTAGE_DEADLINES_S = 2 * TIMEOUT_S
OUTAGE_SLACK_PROBES = 2000


def _limit_s() -> float:
    return bound(OUTAGE_DEADLINES_S, OUTAGE_SLACK_PROBES)
NS = "degraded"


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as exc:  # the caller asserts on the exception
        out = exc
    return out, time.monotonic() - t0


def _rec(key: str) -> IndexRecord:
    return IndexRecord(namespace="ns", kind="kernel", key=key, digest="a" * 64, size=1, meta="{}")


# ---- backends alone ----------------------------------------------------------------------------


def _index_calls(idx: RedisIndex) -> dict[str, Callable[[], Any]]:
    return {
        "ping": idx.ping,
        "get": lambda: idx.get("ns", "kernel", "K"),
        "get_many": lambda: idx.get_many("ns", "kernel", ["K1", "K2"]),
        "missing": lambda: idx.missing("ns", "kernel", ["K1"]),
        "put_if_absent": lambda: idx.put_if_absent(_rec("K")),
        "list": lambda: idx.list("ns", "kernel"),
        "touch": lambda: idx.touch("ns", "kernel", ["K"], time.time()),
        "usage": idx.usage,
        "delete": lambda: idx.delete("ns", "kernel", "K"),
    }


def _blob_calls(store: S3BlobStore) -> dict[str, Callable[[], Any]]:
    data = b"outage"
    d = hashlib.sha256(data).hexdigest()
    return {
        "ping": store.ping,
        "put": lambda: store.put(d, data),
        "get": lambda: store.get(d),
        "size": lambda: store.size(d),
        "delete": lambda: store.delete(d),
    }


def _assert_all_unavailable(calls: dict[str, Callable[[], Any]], timeout_s: float) -> None:
    for name, call in calls.items():
        out, took = _timed(call)
        assert isinstance(out, BackendUnavailable), f"{name}: {out!r}"
        # One attempt may use the whole timeout, after fast failures retried within it; an S3
        # PUT also waits up to botocore's fixed 1 s for "100 Continue" before sending its body.
        assert took < bound(2 * timeout_s + 1.0, 400), f"{name} took {took:.1f}s"


@pytest.fixture(params=["refused", "hang", "reset"])
def bad_port(request: pytest.FixtureRequest) -> Iterator[int]:
    if request.param == "refused":
        yield free_port()
    else:
        with servers.BadListener(request.param) as listener:
            yield listener.port


SHAPE_TIMEOUT_S = 0.5


def test_redis_index_outage_shapes(bad_port: int) -> None:
    for url in (f"redis://127.0.0.1:{bad_port}/0", f"redis+cluster://127.0.0.1:{bad_port}"):
        idx = RedisIndex(url, timeout_s=SHAPE_TIMEOUT_S)  # never touches the network when built
        calls = _index_calls(idx)
        if "cluster" in url:  # same code paths as standalone once connected; keep the run short
            calls = {k: calls[k] for k in ("ping", "get", "put_if_absent")}
        try:
            _assert_all_unavailable(calls, SHAPE_TIMEOUT_S)
        finally:
            idx.close()


def test_s3_blob_store_outage_shapes(bad_port: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    servers.isolate_aws_env(monkeypatch, tmp_path)
    store = S3BlobStore("s3://bucket/prefix", timeout_s=SHAPE_TIMEOUT_S, endpoint_url=f"http://127.0.0.1:{bad_port}")
    try:
        _assert_all_unavailable(_blob_calls(store), SHAPE_TIMEOUT_S)
    finally:
        store.close()


def test_s3_wrong_credentials_and_missing_bucket(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    weed = servers.seaweedfs(request.config)
    servers.isolate_aws_env(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = S3BlobStore(f"s3://{servers.TEST_BUCKET}/x", timeout_s=2, endpoint_url=weed.endpoint)
    for name, call in _blob_calls(store).items():
        out, _ = _timed(call)
        assert isinstance(out, S3AccessDenied), f"{name}: {out!r}"
        assert "access denied" in str(out) and "credentials" in str(out)

    servers.isolate_aws_env(monkeypatch, tmp_path)
    missing = S3BlobStore("s3://no-such-bucket-kcache/x", timeout_s=2, endpoint_url=weed.endpoint)
    out, _ = _timed(missing.ping)
    assert isinstance(out, BackendUnavailable) and "does not exist" in str(out)
    out, _ = _timed(lambda: missing.get("0" * 64))
    assert isinstance(out, BackendUnavailable) and "does not exist" in str(out)


def test_redis_index_reconnects_after_restart(tmp_path: Path) -> None:
    server = servers.RedisServer(tmp_path / "redis").start()
    idx = RedisIndex(server.url, timeout_s=2)
    try:
        idx.put_if_absent(_rec("K"))
        server.restart()  # same port; every pooled connection is now dead
        # The first call after the restart already succeeds: the dropped connection is
        # replaced and the command retried (and the Lua scripts reloaded after NOSCRIPT).
        assert idx.get("ns", "kernel", "K") is None  # no persistence: the restart emptied it
        assert idx.put_if_absent(_rec("K")).digest == "a" * 64
    finally:
        idx.close()
        server.stop()


# ---- a real service over private servers --------------------------------------------------------


@dataclass
class Rig:
    redis: servers.RedisServer
    weed: servers.SeaweedFS
    service: ServerProcess
    packs: dict[str, bytes]
    bucket: str

    def request(self, method: str, path: str, **kw: Any) -> tuple[httpx.Response, float]:
        t0 = time.monotonic()
        resp = httpx.request(method, f"{self.service.url}{path}", timeout=HANG_S, **kw)
        return resp, time.monotonic() - t0

    def put(self, key: str) -> tuple[httpx.Response, float]:
        return self.request("PUT", f"/v1/{NS}/kernels/{key}", content=self.packs[key],
                            headers={"Content-Type": MEDIA_TYPE})

    def get(self, key: str) -> tuple[httpx.Response, float]:
        return self.request("GET", f"/v1/{NS}/kernels/{key}")

    def wait_ready(self, timeout: float = HANG_S) -> float:
        t0 = time.monotonic()
        wait_until("service /readyz", lambda: self.request("GET", "/readyz")[0].status_code == 200,
                           timeout, self.service.proc, self.service.log)
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    from kcache_testkit.corpus import compile_small

    root = tmp_path_factory.mktemp("degraded")
    redis = servers.RedisServer(root / "redis").start()
    weed = servers.SeaweedFS(root / "seaweedfs")
    service = None
    try:
        weed.start()
        bucket = weed.create_bucket("degraded")
        service = backend_server(root / "service", weed.env() | {
            "KCACHE_BLOB_URL": f"s3://{bucket}/packs",
            "KCACHE_INDEX_URL": redis.url,
            "KCACHE_BACKEND_TIMEOUT_S": str(TIMEOUT_S),
        }).launch()
        packs = {}
        for d in compile_small(root / "triton", count=6, arch=80):
            manifest, pack = pack_kernel_dir(d)
            packs[manifest.key] = pack
        rig = Rig(redis, weed, service, packs, bucket)
        rig.wait_ready()
        yield rig
    finally:
        if service is not None:
            service.stop()
        weed.stop()
        redis.stop()


def _assert_503(resp: httpx.Response, took: float, what: str) -> None:
    assert resp.status_code == 503, f"{what}: {resp.status_code} {resp.text[:300]}"
    assert took < _limit_s(), f"{what} took {took:.1f}s"
    if resp.request.method != "HEAD":
        body = resp.json()
        assert body.get("error", {}).get("code") == "backend_unavailable" or what == "readyz", body


def _assert_outage(rig: Rig, stored: str, new: str, failing: str) -> None:
    resp, took = rig.request("GET", "/readyz")
    _assert_503(resp, took, "readyz")
    assert resp.json()["checks"][failing] != "ok" and all(
        v == "ok" for k, v in resp.json()["checks"].items() if k != failing)
    _assert_503(*rig.get(stored), "GET stored kernel")
    _assert_503(*rig.put(new), "PUT new kernel")
    resp, took = rig.request("POST", f"/v1/{NS}/kernels:missing", json={"keys": [stored, new]})
    if failing == "index":
        _assert_503(resp, took, "missing")
    else:  # the index still answers what is stored
        assert resp.status_code == 200 and resp.json()["missing"] == [new] and took < _limit_s()


def _retry_put(rig: Rig, key: str, within: float = HANG_S) -> httpx.Response:
    # Right after a restart SeaweedFS's S3 port answers before its volume server has
    # re-registered; writes are 503 (fast) for a moment. Clients retry 503s.
    deadline = time.monotonic() + within
    while True:
        resp, took = rig.put(key)
        assert took < _limit_s()
        if resp.status_code != 503 or time.monotonic() > deadline:
            return resp
        time.sleep(0.2)


def test_redis_outage_and_recovery(rig: Rig) -> None:
    a, b, c = list(rig.packs)[:3]
    assert rig.put(a)[0].status_code == 201

    rig.redis.stop()  # SIGKILL: connection refused, pooled connections dead
    _assert_outage(rig, stored=a, new=b, failing="index")

    rig.redis.start()  # same port, empty (no persistence)
    assert rig.wait_ready() < bound(0, 30_000)  # ~15 s idle
    resp, _ = rig.put(b)
    assert resp.status_code == 201, resp.text
    resp, _ = rig.get(b)
    assert resp.status_code == 200 and resp.content == rig.packs[b]
    assert rig.get(a)[0].status_code == 404  # its record went with the Redis data...
    assert rig.put(a)[0].status_code == 201  # ...and writing it again works (the blob is deduplicated)

    rig.redis.pause()  # SIGSTOP: connections stay open, nothing answers -> socket timeouts
    try:
        _assert_outage(rig, stored=a, new=c, failing="index")
    finally:
        rig.redis.resume()
    rig.wait_ready(bound(0, 30_000))
    resp, _ = rig.get(b)
    assert resp.status_code == 200 and resp.content == rig.packs[b]


def test_s3_outage_and_recovery(rig: Rig) -> None:
    d, e, f = list(rig.packs)[3:6]
    assert _retry_put(rig, d).status_code == 201

    rig.weed.stop()  # SIGKILL
    _assert_outage(rig, stored=d, new=e, failing="blobs")
    resp, took = rig.request("GET", f"/v1/{NS}/kernels/{d}/manifest")
    assert resp.status_code == 200 and took < _limit_s()  # metadata lives in the index

    rig.weed.start()  # same data dir and ports
    rig.weed.wait_serving(rig.bucket)  # SeaweedFS itself needs a moment to be whole again
    assert rig.wait_ready() < bound(0, 30_000)  # ~15 s idle
    resp, _ = rig.get(d)
    assert resp.status_code == 200 and resp.content == rig.packs[d]  # survived the crash
    resp = _retry_put(rig, e)
    assert resp.status_code == 201, resp.text
    assert rig.get(e)[0].content == rig.packs[e]

    rig.weed.pause()  # SIGSTOP: TCP connects, no answer -> read timeouts
    try:
        _assert_outage(rig, stored=d, new=f, failing="blobs")
    finally:
        rig.weed.resume()
    rig.weed.wait_serving(rig.bucket)
    rig.wait_ready(bound(0, 30_000))
    resp = _retry_put(rig, f)
    assert resp.status_code == 201, resp.text
    for key in (d, e, f):
        resp, _ = rig.get(key)
        assert resp.status_code == 200 and resp.content == rig.packs[key]
