"""Retention in the production shape: two real ``kcache serve`` replicas over one SeaweedFS (S3)
and one Redis, each running its background GC every second (the lease lets one work at a time)
and an admin's ``POST gc`` on top, while two writers fill a namespace with real kernels and
entries far past its soft and hard limits and a reader reads a working set through both
replicas.

Checked: the working set is read whole on every request and never lost; no answer is a 5xx or
a torn body; uploads past the hard limit get 507 ``insufficient_storage`` and nothing else
fails; usage never passes the hard limit by more than the uploads in flight; the GC brings it
under the soft limit; at the end every index record has its blob, and after an orphan sweep
every blob has its record and its reference.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from pathlib import Path

import httpx
import pytest
import servers
from kcache_schemas.pack import MEDIA_TYPE, pack_kernel_dir, read_kernel_dir
from kcache_server.storage.redis_index import RedisIndex
from kcache_server.storage.s3_blobs import S3BlobStore

from kcache_testkit.pace import HANG_S
from kcache_testkit.service import ServerProcess, backend_server

pytestmark = pytest.mark.slow

NS = "fleet-retention"


def test_two_replicas_fill_past_the_limits_with_gc_running(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache_testkit.corpus import compile_small

    weed = servers.seaweedfs(request.config)
    redis_url = servers.shared_redis_url(request.config)
    blob_prefix, key_prefix = servers.unique("retention-"), servers.unique("kct-")
    rules = {"default": {"min_age": "1s"}, "gc_interval": "1s", "orphan_interval": "3s", "orphan_min_age": "0s"}
    env = weed.env() | {
        "KCACHE_BLOB_URL": f"s3://{servers.TEST_BUCKET}/{blob_prefix}",
        "KCACHE_INDEX_URL": f"{redis_url}?prefix={key_prefix}",
        "KCACHE_ACCESS_FLUSH_S": "0.2",
    }
    # Compile while nothing else runs, then size the limits to what we will write.
    dirs = compile_small(tmp_path / "triton", count=6, arch=90)
    items: list[tuple[str, str, bytes]] = [("kernels", d.name, pack_kernel_dir(d)[1]) for d in dirs]
    files = [data for d in dirs for name, data in sorted(read_kernel_dir(d).items()) if not name.endswith(".json")]
    items += [("entries/fx-graph", f"pt2:fx-graph-v1::{i:04d}", data) for i, data in enumerate(files[:30])]
    total = sum(len(d) for _, _, d in items)
    soft, hard = total // 3, total // 2
    rules["namespaces"] = {NS: {"soft_limit": soft, "hard_limit": hard}}
    env["KCACHE_RETENTION"] = json.dumps(rules)
    replicas = [backend_server(tmp_path / f"r{i}", env, name=f"replica{i}").launch() for i in range(2)]
    try:
        for r in replicas:
            r.wait_ready()
        _run(replicas, items, soft, hard)
        servers.isolate_aws_env(monkeypatch, tmp_path)
        _check_storage(f"s3://{servers.TEST_BUCKET}/{blob_prefix}", weed.endpoint, f"{redis_url}?prefix={key_prefix}", replicas[0])
    finally:
        for r in replicas:
            r.stop()
        servers.drop_prefix(redis_url, key_prefix)
        weed.empty(servers.TEST_BUCKET, blob_prefix)


def _url(replica: ServerProcess, path: str, key: str) -> str:
    return f"{replica.url}/v1/{NS}/{path}/{key}"


def _run(replicas: list[ServerProcess], items: list[tuple[str, str, bytes]], soft: int, hard: int) -> None:
    working = [items[0], items[6], items[7]]  # a kernel and two entries
    biggest = max(len(d) for _, _, d in items)
    problems: list[str] = []
    counts = {"reads": 0, "misses": 0, "written": 0, "refused": 0, "gc_runs": 0, "gc_busy": 0}
    peak = [0]
    stop = threading.Event()
    with httpx.Client(timeout=HANG_S, follow_redirects=True) as c:
        for path, key, data in working:
            r = c.put(_url(replicas[0], path, key), content=data, headers={"Content-Type": MEDIA_TYPE})
            assert r.status_code == 201, r.text

        def reader() -> None:
            rng = random.Random(1)
            with httpx.Client(timeout=HANG_S) as rc:
                while not stop.is_set():
                    for i, (path, key, data) in enumerate([*working, rng.choice(items)]):
                        r = rc.get(_url(replicas[(counts["reads"] + i) % 2], path, key))
                        if r.status_code == 200 and r.content == data:
                            counts["reads"] += 1
                        elif r.status_code == 404 and i == len(working):
                            counts["misses"] += 1  # an item outside the working set may be evicted
                        else:
                            problems.append(f"GET {path}/{key[:20]}: {r.status_code} {len(r.content)} bytes {r.text[:200]!r}")
                    time.sleep(0.02)

        def writer(replica: ServerProcess, mine: list[tuple[str, str, bytes]]) -> None:
            with httpx.Client(timeout=HANG_S) as wc:
                for pause, (path, key, data) in [(0.0, i) for i in mine] + [(0.1, i) for i in mine]:
                    r = wc.put(_url(replica, path, key), content=data, headers={"Content-Type": MEDIA_TYPE})
                    if r.status_code in (200, 201):
                        counts["written"] += 1
                    elif r.status_code == 507 and r.json()["error"]["code"] == "insufficient_storage":
                        counts["refused"] += 1
                    else:
                        problems.append(f"PUT {path}/{key[:20]}: {r.status_code} {r.text[:200]}")
                    time.sleep(pause)

        def admin() -> None:
            with httpx.Client(timeout=HANG_S) as ac:
                while not stop.wait(0.7):
                    r = ac.post(f"{replicas[1].url}/v1/{NS}/gc", json={})
                    if r.status_code == 200:
                        counts["gc_runs"] += 1
                    elif r.status_code == 409:
                        counts["gc_busy"] += 1  # the background GC of a replica holds the lease
                    else:
                        problems.append(f"POST gc: {r.status_code} {r.text[:200]}")
                    usage = ac.get(f"{replicas[0].url}/v1/{NS}/gc").json()["usage"]["bytes"]
                    peak[0] = max(peak[0], usage)

        background = [threading.Thread(target=reader), threading.Thread(target=admin)]
        writers = [threading.Thread(target=writer, args=(replicas[i], items[i::2])) for i in range(2)]
        for t in background + writers:
            t.start()
        for t in writers:
            t.join(HANG_S)
        deadline = time.monotonic() + HANG_S  # a hang guard: the loop ends once usage is under the soft limit
        usage = hard + 1
        while time.monotonic() < deadline:
            usage = c.get(f"{replicas[0].url}/v1/{NS}/gc").json()["usage"]["bytes"]
            peak[0] = max(peak[0], usage)
            if usage <= soft:
                break
            time.sleep(0.3)
        stop.set()
        for t in background:
            t.join(HANG_S)
        assert not problems, problems[:5]
        assert counts["reads"] > 50 and counts["refused"] > 0 and counts["written"] > len(items), counts
        assert counts["gc_runs"] + counts["gc_busy"] > 0, counts
        # Two writers may pass the check at the same moment: at most one upload each beyond it.
        assert peak[0] <= hard + 2 * biggest, (peak[0], hard)
        assert usage <= soft, (usage, soft)
        for path, key, data in working:
            for replica in replicas:
                assert c.get(_url(replica, path, key)).content == data
        status = c.get(f"{replicas[0].url}/v1/{NS}/gc").json()
        assert status["last_run"] is not None and status["policy"]["hard_limit_bytes"] == hard
        metrics = "".join(c.get(f"{r.url}/metrics").text for r in replicas)
        assert f'kcache_gc_evicted_bytes_total{{namespace="{NS}",reason="budget"}}' in metrics
        # Sweep the orphans now (a writer that lost a race leaves none, a crash would).
        r = c.post(f"{replicas[0].url}/v1/{NS}/gc", json={"orphans": True, "min_age_s": 0})
        deadline = time.monotonic() + HANG_S  # a background GC holds the lease for one pass
        while time.monotonic() < deadline:
            if r.status_code != 409:
                break
            time.sleep(0.2)
            r = c.post(f"{replicas[0].url}/v1/{NS}/gc", json={"orphans": True, "min_age_s": 0})
        assert r.status_code == 200, r.text


def _check_storage(blob_url: str, endpoint: str, index_url: str, replica: ServerProcess) -> None:
    """Straight from S3 and Redis: every record has its blob; every blob has a record and a reference."""
    blobs, index = S3BlobStore(blob_url, endpoint_url=endpoint), RedisIndex(index_url)
    try:
        named: set[str] = set()
        for ns, kinds in index.usage().items():
            for kind in kinds:
                after = ""
                while page := index.list(ns, kind, after=after, limit=500):
                    for rec in page:
                        if rec.digest:
                            assert blobs.size(rec.digest) == rec.size, f"{kind}/{rec.key}: record without its blob"
                            named.add(rec.digest)
                    after = page[-1].key
        stored = {b.digest for b in blobs.scan()}
        assert named == stored, (sorted(stored - named)[:3], sorted(named - stored)[:3])
        assert set(index.blob_refs(sorted(stored))) == named
        for digest in stored:
            assert hashlib.sha256(blobs.get(digest)).hexdigest() == digest  # whole blobs only
    finally:
        blobs.close()
        index.close()
    assert "Traceback" not in replica.stderr()
