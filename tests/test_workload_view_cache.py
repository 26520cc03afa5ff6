"""A replica serves a workload's view from memory for a moment (issue #31), on every index.

Each rank of each node of a fleet start reads the same view: 8 reads per node start were two
thirds of the service's index commands. The cache may be stale only as far as the TTL and only
for what another replica did: what this replica published or quarantined shows at once."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kcache_schemas import PackLimits, Producer
from kcache_schemas.models import EnvFingerprint, WorkloadManifest, WorkloadView
from kcache_server.domain_errors import NotFound
from kcache_server.storage import Index
from kcache_server.storage.file_blobs import FileBlobStore
from kcache_server.store import CacheStore
from kcache_server.store.workload_manifests import WorkloadManifests

FP = EnvFingerprint(torch="2.13")
ENTRY = "e" * 40


def _run(*kernels: str) -> WorkloadManifest:
    return WorkloadManifest(name="w", fingerprint=FP, kernels=list(kernels), entries=[{"layer": "dynamo", "key": ENTRY}])


# Kernel keys as the service keeps them (a sha256, in Triton's base32), in the order views list them.
K1, K2, K3 = sorted(_run(hashlib.sha256(n.encode()).hexdigest()).kernels[0] for n in ("k1", "k2", "k3"))


class Replicas:
    """Two replicas over one index and blob store: ``a`` caches views (its clock is ``now``), ``b`` does not."""

    def __init__(self, index: Index, tmp_path: Path, ttl_s: float) -> None:
        self.now = 100.0
        blobs = FileBlobStore(tmp_path / "blobs")
        self.store_a = CacheStore(blobs, index, PackLimits(), access_flush_s=60)
        self.store_b = CacheStore(blobs, index, PackLimits(), access_flush_s=60)
        s = self.store_a
        self.a = WorkloadManifests(index, s.records, s.access, s.quarantine, view_ttl_s=ttl_s, clock=lambda: self.now)
        self.b = self.store_b.workloads

    def kernels_a(self) -> list[str]:
        return self.a.view("ns", "w").kernels

    def close(self) -> None:
        self.store_a.access.close()
        self.store_b.access.close()


@pytest.fixture
def replicas(index: Index, tmp_path: Path) -> Iterator[Replicas]:
    r = Replicas(index, tmp_path, ttl_s=1.0)
    yield r
    r.close()


def test_another_replicas_publish_shows_within_the_ttl(replicas: Replicas) -> None:
    with pytest.raises(NotFound):
        replicas.a.view("ns", "w")
    replicas.b.publish("ns", "w", _run(K1))
    assert replicas.kernels_a() == [K1]  # a miss is not remembered: the first publish shows at once
    replicas.b.publish("ns", "w", _run(K2))
    replicas.now += 0.9
    assert replicas.kernels_a() == [K1]  # from memory: another replica's publish is not seen yet
    replicas.now += 0.2
    assert replicas.kernels_a() == [K1, K2]


def test_this_replicas_publish_and_quarantine_show_at_once(replicas: Replicas) -> None:
    replicas.store_a.entries.put("ns", "dynamo", ENTRY, b"package", Producer())
    replicas.a.publish("ns", "w", _run(K1))
    assert [e.key for e in replicas.a.view("ns", "w").entries] == [ENTRY]
    replicas.a.publish("ns", "w", _run(K3))
    assert replicas.kernels_a() == [K1, K3]
    replicas.store_a.quarantine.report("ns", "dynamo", ENTRY, "TypeError: torch could not load it")
    assert replicas.a.view("ns", "w").entries == []  # never prefetched once quarantined here
    replicas.store_a.quarantine.lift("ns", "dynamo", ENTRY)
    assert [e.key for e in replicas.a.view("ns", "w").entries] == [ENTRY]


def test_another_replicas_quarantine_shows_within_the_ttl(replicas: Replicas) -> None:
    replicas.b.publish("ns", "w", _run(K1))
    assert len(replicas.a.view("ns", "w").entries) == 1
    replicas.store_b.quarantine.report("ns", "dynamo", ENTRY, "TypeError")
    assert len(replicas.a.view("ns", "w").entries) == 1
    replicas.now += 1.0
    assert replicas.a.view("ns", "w").entries == []


def test_ttl_zero_reads_every_view(index: Index, tmp_path: Path) -> None:
    r = Replicas(index, tmp_path, ttl_s=0.0)
    try:
        r.b.publish("ns", "w", _run(K1))
        assert r.kernels_a() == [K1]
        r.b.publish("ns", "w", _run(K2))
        assert r.kernels_a() == [K1, K2]
    finally:
        r.close()


class CountingViews(WorkloadManifests):
    """Counts the index reads of views; each takes a moment, as over a network."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0
        self._count_lock = threading.Lock()

    def _read_view(self, namespace: str, name: str, fingerprint: str | None) -> WorkloadView:
        with self._count_lock:
            self.reads += 1
        time.sleep(0.2)
        return super()._read_view(namespace, name, fingerprint)


def _at_once(views: WorkloadManifests, n: int) -> list[object]:
    start = threading.Barrier(n)

    def one(_: int) -> object:
        start.wait()
        try:
            return views.view("ns", "w")
        except NotFound as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_a_nodes_ranks_asking_at_once_read_the_view_once(index: Index, tmp_path: Path) -> None:
    """The 8 ranks of a node ask in the same instant: before, all 8 missed the cache and read."""
    store = CacheStore(FileBlobStore(tmp_path / "blobs"), index, PackLimits(), access_flush_s=60)
    views = CountingViews(index, store.records, store.access, store.quarantine, view_ttl_s=1.0)
    try:
        assert all(isinstance(r, NotFound) for r in _at_once(views, 4))  # a failed read is nobody's answer
        assert views.reads == 4
        store.workloads.publish("ns", "w", _run(K1))
        answers = _at_once(views, 8)
        assert views.reads == 5 and all(a is answers[0] for a in answers)
        assert isinstance(answers[0], WorkloadView) and answers[0].kernels == [K1]
    finally:
        store.access.close()
