"""Three real ``kcache serve`` replicas over one SeaweedFS (S3) and one Redis.

What a fleet relies on: a kernel written through any replica is served by every replica at
once, and when replicas race to write one key, exactly one write wins everywhere (the index's
atomic put-if-absent is the commit point) - with real compiled Triton kernels.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import servers
from kcache.config import ClientConfig
from kcache.store.local_store import LocalEntryStore
from kcache.transport.http import KcacheClient
from kcache.transport.workload import fetch_view, publish, pull_workload
from kcache_schemas import wire
from kcache_schemas.pack import (
    MEDIA_TYPE,
    build_pack,
    manifest_for_files,
)

from kcache_testkit.kernels import Kernel, real_kernels
from kcache_testkit.pace import HANG_S
from kcache_testkit.service import ServerProcess, backend_server

pytestmark = pytest.mark.slow

NS = "replica-test"


@dataclass
class Fleet:
    replicas: list[ServerProcess]
    kernels: list[Kernel]
    presigned: ServerProcess  # the replica configured with KCACHE_PRESIGNED_DOWNLOADS
    s3_endpoint: str


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("replicas")
    weed = servers.seaweedfs(request.config)
    redis_url = servers.shared_redis_url(request.config)
    blob_prefix, key_prefix = servers.unique("replicas-"), servers.unique("kct-")
    env = weed.env() | {
        "KCACHE_BLOB_URL": f"s3://{servers.TEST_BUCKET}/{blob_prefix}",
        "KCACHE_INDEX_URL": f"{redis_url}?prefix={key_prefix}",
        "KCACHE_BACKEND_TIMEOUT_S": "5",
        "KCACHE_ACCESS_FLUSH_S": "0.5",
    }
    replicas = [
        backend_server(root / f"r{i}", env | ({"KCACHE_PRESIGNED_DOWNLOADS": "true"} if i == 2 else {}),
                       name=f"replica{i}").launch()
        for i in range(3)
    ]
    try:
        # Compile while the replicas boot: 4 real sm_90 kernels, packed as a client would.
        kernels = real_kernels(root / "triton", count=4)
        for r in replicas:
            r.wait_ready()
        yield Fleet(replicas, kernels, replicas[2], weed.endpoint)
    finally:
        for r in replicas:
            r.stop()
        servers.drop_prefix(redis_url, key_prefix)
        weed.empty(servers.TEST_BUCKET, blob_prefix)


def _variant(kernel: Kernel, tag: str) -> bytes:
    """Another valid pack for the same key: different .ptx text, same metadata hash."""
    files = dict(kernel.files)
    ptx = next(n for n in files if n.endswith(".ptx"))
    files[ptx] = files[ptx] + f"\n// variant {tag}\n".encode()
    return bytes(build_pack(manifest_for_files(kernel.key, files), files))


def _get(replica: ServerProcess, key: str) -> bytes:
    with httpx.Client(follow_redirects=True, timeout=HANG_S) as client:
        resp = client.get(f"{replica.url}/v1/{NS}/kernels/{key}")
    assert resp.status_code == 200, resp.text
    return resp.content


def _put(replica: ServerProcess, key: str, pack: bytes) -> httpx.Response:
    return httpx.put(f"{replica.url}/v1/{NS}/kernels/{key}", content=pack,
                     headers={"Content-Type": MEDIA_TYPE}, timeout=HANG_S)


def test_write_through_one_replica_read_through_all(fleet: Fleet) -> None:
    k = fleet.kernels[0]
    writer, *others = fleet.replicas
    resp = _put(writer, k.key, k.pack)
    assert resp.status_code == 201, resp.text
    manifest = resp.json()
    for r in others:
        # No delay, no cache warm-up: the other replicas see the committed index record at once.
        assert _get(r, k.key) == k.pack
        got = httpx.get(f"{r.url}/v1/{NS}/kernels/{k.key}/manifest", timeout=HANG_S)
        assert got.status_code == 200 and got.json() == manifest
        missing = httpx.post(f"{r.url}/v1/{NS}/kernels:missing",
                             json={"keys": [k.key, fleet.kernels[1].key]}, timeout=HANG_S)
        assert missing.json()["missing"] == [fleet.kernels[1].key]
    # Identical re-upload through another replica: accepted, not a new entry.
    assert _put(others[0], k.key, k.pack).status_code == 200


def test_presigned_download_redirects_to_s3(fleet: Fleet) -> None:
    k = fleet.kernels[0]
    _put(fleet.replicas[0], k.key, k.pack)
    resp = httpx.get(f"{fleet.presigned.url}/v1/{NS}/kernels/{k.key}", timeout=HANG_S)
    assert resp.status_code == 307
    location = resp.headers["location"]
    assert location.startswith(fleet.s3_endpoint + "/") and "X-Amz-Signature=" in location
    direct = httpx.get(location, timeout=HANG_S)  # straight from the bucket, not through the API tier
    assert direct.status_code == 200 and direct.content == k.pack


@pytest.mark.parametrize("kernel_index", [1, 2])
def test_racing_conflicting_writes_have_one_winner(fleet: Fleet, kernel_index: int) -> None:
    k = fleet.kernels[kernel_index]
    packs = [_variant(k, f"{kernel_index}-{i}") for i in range(len(fleet.replicas))]
    assert len(set(packs)) == len(packs)
    barrier = threading.Barrier(len(packs))

    def put(i: int) -> httpx.Response:
        barrier.wait()
        return _put(fleet.replicas[i], k.key, packs[i])

    with ThreadPoolExecutor(len(packs)) as pool:
        responses = list(pool.map(put, range(len(packs))))
    codes = sorted(r.status_code for r in responses)
    assert codes == [201, 409, 409], [r.text for r in responses]
    winner = packs[next(i for i, r in enumerate(responses) if r.status_code == 201)]
    for r in responses:
        if r.status_code == 409:
            assert r.json()["error"]["code"] == "conflict"
    for replica in fleet.replicas:
        assert _get(replica, k.key) == winner
    # The losers stay losers: write-once.
    loser = next(p for p in packs if p != winner)
    assert _put(fleet.replicas[1], k.key, loser).status_code == 409


def test_racing_identical_writes_create_once(fleet: Fleet) -> None:
    k = fleet.kernels[3]
    barrier = threading.Barrier(len(fleet.replicas))

    def put(replica: ServerProcess) -> int:
        barrier.wait()
        return _put(replica, k.key, k.pack).status_code

    with ThreadPoolExecutor(len(fleet.replicas)) as pool:
        codes = sorted(pool.map(put, fleet.replicas))
    assert codes == [200, 200, 201]
    for replica in fleet.replicas:
        assert _get(replica, k.key) == k.pack


# ---- presigned prefetch: the bytes come from S3, the API tier answers the index (issue #31) ----

PREFETCH_NS = "replica-prefetch"
WORKLOAD = "presigned-burst"
_SENT = re.compile(r'^kcache_bytes_sent_total\{layer="([^"]+)"\} ([0-9.e+]+)$', re.MULTILINE)


def _lookups(replica: ServerProcess, layer: str, result: str) -> float:
    text = httpx.get(f"{replica.url}/metrics", timeout=HANG_S).text
    found = re.search(rf'^kcache_lookups_total\{{layer="{layer}",result="{result}"\}} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _sent(replica: ServerProcess) -> dict[str, float]:
    return {layer: float(v) for layer, v in _SENT.findall(httpx.get(f"{replica.url}/metrics", timeout=HANG_S).text)}


@pytest.fixture(scope="module")
def published(fleet: Fleet) -> bytes:
    """The fleet's kernels and one FX-graph entry in their own namespace, with a workload naming
    them (published through a replica without presigned downloads); the entry's bytes."""
    writer = fleet.replicas[0].url
    entry = os.urandom(200_000)
    for k in fleet.kernels:
        r = httpx.put(f"{writer}/v1/{PREFETCH_NS}/kernels/{k.key}", content=k.pack, headers={"Content-Type": MEDIA_TYPE}, timeout=HANG_S)
        assert r.status_code in (200, 201), r.text
    r = httpx.put(f"{writer}/v1/{PREFETCH_NS}/entries/fx-graph/e1", content=entry, timeout=HANG_S,
                  headers={"Content-Type": "application/octet-stream", wire.COMPILE_TIME: "7.250"})
    assert r.status_code in (200, 201), r.text
    client = KcacheClient(ClientConfig(url=writer, namespace=PREFETCH_NS, read_timeout_s=HANG_S))
    publish(client, WORKLOAD, {k.key for k in fleet.kernels}, {("fx-graph", "e1")})
    client.close()
    return entry


def test_prefetch_through_a_presigned_replica_takes_the_bytes_from_s3(fleet: Fleet, published: bytes, tmp_path: Path) -> None:
    replica = fleet.presigned
    before = _sent(replica)
    client = KcacheClient(ClientConfig(url=replica.url, namespace=PREFETCH_NS, read_timeout_s=HANG_S))
    local = LocalEntryStore(tmp_path, PREFETCH_NS, url=replica.url)
    view = fetch_view(client, WORKLOAD)
    assert view is not None and client.presigned_downloads

    counts = pull_workload(client, view, local)

    assert (counts["kernels"], counts["entries"], counts["refused"]) == (len(fleet.kernels), 1, 0)
    for k in fleet.kernels:
        assert local.get("kernel", k.key) == k.pack
    assert local.get("fx-graph", "e1") == published
    after = _sent(replica)
    pack_bytes = sum(len(k.pack) for k in fleet.kernels)
    # The replica sent the URL lists (JSON) for the packs and the entry, not their bytes.
    assert after.get("kernel", 0) - before.get("kernel", 0) < pack_bytes / 4
    assert after.get("fx-graph", 0) - before.get("fx-graph", 0) == 0
    assert client.get_entry("fx-graph", "e1") == (published, 7.25)  # the compile time rode on the 307
    client.close()


def test_entry_urls_answer_urls_only_where_presigned_downloads_are_on(fleet: Fleet, published: bytes) -> None:
    path = wire.path(wire.ENTRIES_BATCH_URLS, namespace=PREFETCH_NS)
    body = {"entries": [{"layer": "fx-graph", "key": "e1"}, {"layer": "autotune", "key": "never-stored"}]}
    plain = httpx.post(f"{fleet.replicas[0].url}{path}", json=body, timeout=HANG_S)
    assert plain.status_code == 200, plain.text
    assert plain.json() == {"urls": [], "inline": [{"layer": "fx-graph", "key": "e1"}],
                            "missing": [{"layer": "autotune", "key": "never-stored"}], "expires_s": 0}

    before = (_lookups(fleet.presigned, "fx-graph", "hit"), _lookups(fleet.presigned, "autotune", "miss"))
    signed = httpx.post(f"{fleet.presigned.url}{path}", json=body, timeout=HANG_S)
    assert signed.status_code == 200, signed.text
    answer = signed.json()
    assert (answer["inline"], answer["missing"], answer["expires_s"]) == ([], [{"layer": "autotune", "key": "never-stored"}], 300)
    # Each entry signed or missing is a lookup of its layer, as its GET would have been.
    assert (_lookups(fleet.presigned, "fx-graph", "hit"), _lookups(fleet.presigned, "autotune", "miss")) == (before[0] + 1, before[1] + 1)
    [url] = answer["urls"]
    assert (url["layer"], url["key"], url["compile_time_s"]) == ("fx-graph", "e1", 7.25)
    assert url["sha256"] == hashlib.sha256(published).hexdigest() and url["url"].startswith(fleet.s3_endpoint + "/")
    assert httpx.get(url["url"], timeout=HANG_S).content == published
    for bad_body in ({"entries": []}, {"entries": [{"layer": "fx graph/..", "key": "e1"}]}, {"keys": ["e1"]}):
        bad = httpx.post(f"{fleet.presigned.url}{path}", json=bad_body, timeout=HANG_S)
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request", bad.text


def test_batch_urls_answer_urls_only_where_presigned_downloads_are_on(fleet: Fleet, published: bytes) -> None:
    k = fleet.kernels[0].key
    absent = base64.b32encode(hashlib.sha256(b"never stored").digest()).decode().rstrip("=")
    body = {"keys": [k, absent, "not-a-key"]}
    path = wire.path(wire.KERNELS_BATCH_URLS, namespace=PREFETCH_NS)

    plain = httpx.post(f"{fleet.replicas[0].url}{path}", json=body, timeout=HANG_S)
    assert plain.status_code == 200, plain.text
    assert plain.json() == {"urls": {}, "inline": [k], "missing": [absent], "invalid": ["not-a-key"], "expires_s": 0}
    view = httpx.get(f"{fleet.replicas[0].url}{wire.path(wire.WORKLOAD, namespace=PREFETCH_NS, name=WORKLOAD)}", timeout=HANG_S)
    assert view.status_code == 200 and wire.DOWNLOADS not in view.headers

    signed = httpx.post(f"{fleet.presigned.url}{path}", json=body, timeout=HANG_S)
    assert signed.status_code == 200, signed.text
    answer = signed.json()
    assert (answer["inline"], answer["missing"], answer["invalid"], answer["expires_s"]) == ([], [absent], ["not-a-key"], 300)
    assert list(answer["urls"]) == [k] and answer["urls"][k].startswith(fleet.s3_endpoint + "/")
    assert httpx.get(answer["urls"][k], timeout=HANG_S).content == fleet.kernels[0].pack
    view = httpx.get(f"{fleet.presigned.url}{wire.path(wire.WORKLOAD, namespace=PREFETCH_NS, name=WORKLOAD)}", timeout=HANG_S)
    assert view.headers[wire.DOWNLOADS] == wire.DOWNLOADS_PRESIGNED
    # The replica hands every node the same URL of a blob for a while (KCACHE_PRESIGN_REUSE_S,
    # default 60 s; signed for 300 + 60 s): one signature, and a URL a cache in front of S3 can keep.
    again = httpx.post(f"{fleet.presigned.url}{path}", json=body, timeout=HANG_S).json()
    assert again["urls"] == answer["urls"] and "X-Amz-Expires=360" in answer["urls"][k]
