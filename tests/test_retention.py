"""Retention: LRU eviction to a byte budget, minimum age, TTL, environment purge, pins, the
hard limit's 507, the orphan sweep, and GC racing live PUTs and GETs - with real kernels on every
index backend (the ``index`` fixture: SQLite, Redis, Redis Cluster) over the file blob store.

Races are interleaved deterministically: the real backends' methods are wrapped on the instance
so that one thread stops at the exact point (e.g. between a PUT's blob write and its index
insert) while the other acts. Ages are arranged by touching records at chosen times and running
the GC at a chosen ``now``; nothing sleeps for an age to pass.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import ADMIN_TOKEN, WRITE_TOKEN
from fastapi.testclient import TestClient
from kcache_schemas import PackLimits, Producer
from kcache_schemas.gc_models import GcReport, GcRequest
from kcache_schemas.models import EntryRef, EnvFingerprint, WorkloadManifest
from kcache_schemas.units import parse_bytes, parse_duration
from kcache_server.app import create_app
from kcache_server.domain_errors import GcBusy, InsufficientStorage, InvalidRequest, NotFound
from kcache_server.kinds import KERNEL, entry_kind
from kcache_server.retention_rules import RetentionConfig
from kcache_server.settings import Settings
from kcache_server.storage import Index
from kcache_server.storage.base import blob_ref
from kcache_server.storage.file_blobs import FileBlobStore
from kcache_server.store import CacheStore
from pydantic import ValidationError

from kcache_testkit.kernels import Kernel
from kcache_testkit.pace import HANG_S

pytest_plugins = ["api_helpers"]

NS = "team"
OLD_ENV = EnvFingerprint(torch="2.9.1", triton="3.5.1", cuda="12.8", gpu_arch="sm_90")
NEW_ENV = EnvFingerprint(torch="2.13.0", triton="3.9.0", cuda="13.0", gpu_arch="sm_90")
HOUR = 3600.0


@pytest.fixture
def store(index: Index, tmp_path: Path) -> Iterator[CacheStore]:
    s = CacheStore(FileBlobStore(tmp_path / "blobs"), index, PackLimits(), access_flush_s=0.05)
    try:
        yield s
    finally:
        s.access.close()


def _entries(kernels: list[Kernel], n: int) -> list[tuple[str, bytes]]:
    """``n`` entries whose payloads are real compiled bytes (the kernels' cubin/ptx/llir files;
    the service treats entries as opaque)."""
    files = [data for k in kernels for name, data in sorted(k.files.items()) if not name.endswith(".json")]
    return [(f"pt2:fx-graph-v1::{i:04d}", files[i]) for i in range(n)]


def _gc(store: CacheStore, now: float | None = None, **request: Any) -> GcReport:
    return store.gc.run(NS, GcRequest(**request), now=now)


def _touch(store: CacheStore, kind: str, keys: list[str], when: float) -> None:
    store.index.touch(NS, kind, keys, when)


# ---- eviction on every index backend -------------------------------------------------------------------


def test_lru_evicts_down_to_the_budget_sparing_recent_and_pinned(store: CacheStore, kernels: list[Kernel]) -> None:
    for k in kernels:
        store.kernels.put(NS, k.key, k.pack)
    base = time.time()
    keys = [k.key for k in kernels]
    for i, key in enumerate(keys):  # k0 least recently used ... k4 most
        _touch(store, KERNEL, [key], base + i)
    now = base + 10 * HOUR
    _touch(store, KERNEL, [keys[0]], now - 60)  # the working set: used a minute ago
    store.workloads.publish(NS, "serving", WorkloadManifest(name="serving", fingerprint=NEW_ENV, kernels=[keys[1]]))
    store.pins.pin(NS, "serving")
    sizes = {k.key: len(k.pack) for k in kernels}
    target = sum(sizes.values()) - sizes[keys[2]] - sizes[keys[3]] // 2  # needs k2 and k3 gone

    report = _gc(store, now=now, max_bytes=target, min_age_s=HOUR)

    assert [i.key for i in report.items] == [keys[2], keys[3]]  # LRU order, skipping pinned k1
    assert report.planned["budget"].entries == 2 and report.evicted == report.planned
    assert report.after.bytes <= target and store.records.cache_usage(NS).bytes == report.after.bytes
    assert report.kept_recent.entries == 1 and report.kept_pinned.entries == 1 and report.pins == ["serving"]
    assert report.blobs_deleted.entries == 2 and report.skipped == 0
    for k in kernels[2:4]:
        with pytest.raises(NotFound):
            store.kernels.pack(NS, k.key)
        assert store.blobs.size(_digest(k.pack)) is None
    for k in (kernels[0], kernels[1], kernels[4]):
        assert store.kernels.pack(NS, k.key)[1] == k.pack
    assert store.index.blob_refs([_digest(k.pack) for k in kernels[2:4]]) == {}


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_a_blob_another_namespace_uses_survives_eviction(store: CacheStore, kernels: list[Kernel]) -> None:
    k = kernels[0]
    store.kernels.put(NS, k.key, k.pack)
    store.kernels.put("other", k.key, k.pack)  # deduplicated: one blob, two records
    report = _gc(store, max_bytes=0, min_age_s=0)
    assert report.evicted["budget"].entries == 1 and report.blobs_shared == 1 and report.blobs_deleted.entries == 0
    assert store.kernels.pack("other", k.key)[1] == k.pack
    report = store.gc.run("other", GcRequest(max_bytes=0, min_age_s=0))
    assert report.blobs_deleted.entries == 1 and store.blobs.size(_digest(k.pack)) is None


def test_ttl_counts_creation_for_never_read_items_and_skips_what_was_used_since_the_scan(store: CacheStore, kernels: list[Kernel]) -> None:
    for k in kernels[:3]:
        store.kernels.put(NS, k.key, k.pack)
    now = time.time() + 2 * 86400
    _touch(store, KERNEL, [kernels[2].key], now - HOUR)  # read within the TTL
    collector = store.gc
    plan = collector.plan(NS, GcRequest(older_than_s=86400), now=now)
    assert sorted(r.key for r, _ in plan.evictions) == sorted(k.key for k in kernels[:2])  # never read: aged by creation
    _touch(store, KERNEL, [kernels[1].key], now - 60)  # a hit flushed between the plan and the eviction
    report = collector._execute(plan, _held_lease(store))
    assert report.evicted["ttl"].entries == 1 and report.skipped == 1
    assert {r.key for r in store.records.all_records(NS, KERNEL)} == {kernels[1].key, kernels[2].key}


def _held_lease(store: CacheStore) -> Any:
    from kcache_server.store.gc import LEASE, LEASE_TTL_S, _Lease

    lease = _Lease(store.index, LEASE, LEASE_TTL_S)
    assert lease.acquire()
    return lease


def test_environment_purge_by_id_by_fields_and_by_idle_policy(store: CacheStore, kernels: list[Kernel]) -> None:
    k = [x.key for x in kernels]
    entries = _entries(kernels, 3)
    for x in kernels:
        store.kernels.put(NS, x.key, x.pack)
    for key, data in entries:
        store.entries.put(NS, "fx-graph", key, data, Producer())
    start = time.time()
    # The old environment's runs used k0, k1 and entry 0; the new one's k1 (shared), k2, entry 1.
    store.workloads.publish(NS, "train", WorkloadManifest(name="train", fingerprint=OLD_ENV, kernels=k[:2], entries=[EntryRef(layer="fx-graph", key=entries[0][0])]))
    store.workloads.publish(NS, "train", WorkloadManifest(name="train", fingerprint=NEW_ENV, kernels=k[1:3], entries=[EntryRef(layer="fx-graph", key=entries[1][0])]))
    collector = store.gc

    # Dry run by id: only what the old environment alone used, and its run.
    plan = collector.plan(NS, GcRequest(env=OLD_ENV.id, min_age_s=0, dry_run=True), now=start + 1)
    assert {(r.kind, r.key) for r, _ in plan.evictions} == {
        (KERNEL, k[0]), (entry_kind("fx-graph"), entries[0][0]), ("workload/train", next(r.key for r in store.records.all_records(NS, "workload/train") if r.key.startswith(OLD_ENV.id)))}
    assert plan.report.env == {"torch": "2.9.1", "triton": "3.5.1", "cuda": "12.8", "gpu_arch": "90"}

    # By fields: what the new environment's runs alone list (its triton and arch match), and the
    # kernels no run lists, on what their own manifests say (triton 3.9.0, sm_90); k1 stays: the
    # old environment's runs list it too, and that one does not match.
    assert kernels[3].manifest.triton_version == NEW_ENV.triton
    plan = collector.plan(NS, GcRequest(env="triton=3.9.0,gpu_arch=sm_90", min_age_s=0), now=start + 1)
    new_run = next(r.key for r in store.records.all_records(NS, "workload/train") if r.key.startswith(NEW_ENV.id))
    assert {r.key for r, _ in plan.evictions} == {k[2], entries[1][0], k[3], k[4], new_run}
    # Asking for torch too: kernels no run lists do not know their torch, so they stay.
    plan = collector.plan(NS, GcRequest(env="triton=3.9.0,torch=2.13.0", min_age_s=0), now=start + 1)
    assert {r.key for r, _ in plan.evictions} == {k[2], entries[1][0], new_run}
    # ... and an id no run has is a clear error (404: the environment is not found).
    with pytest.raises(NotFound, match="kcache ls --workloads"):
        collector.plan(NS, GcRequest(env="0123456789abcdef"))
    with pytest.raises(InvalidRequest, match="field=value"):
        collector.plan(NS, GcRequest(env="pytorch=2.9"))

    # The policy: the old environment idle for 8 days, the new one used an hour ago.
    now = start + 8 * 86400
    _touch(store, KERNEL, k[1:3], now - HOUR)
    store.workloads.publish(NS, "train", WorkloadManifest(name="train", fingerprint=NEW_ENV, kernels=k[1:3], entries=[EntryRef(layer="fx-graph", key=entries[1][0])]))
    store.access.flush()  # the re-publish counts as a use of the new environment
    store.index.touch(NS, "workload/train", [r.key for r in store.records.all_records(NS, "workload/train") if r.key.startswith(NEW_ENV.id)], now - HOUR)
    store.retention = RetentionConfig.model_validate({"default": {"env_idle": "7d", "min_age": "1h"}})
    report = store.gc.run(NS, GcRequest(), now=now)
    assert report.evicted["env"].entries == 2  # k0 and entry 0
    left = {r.key for r in store.records.all_records(NS, KERNEL)} | {r.key for r in store.records.all_records(NS, entry_kind("fx-graph"))}
    assert left == set(k[1:]) | {entries[1][0], entries[2][0]}
    assert [r.key.split("/")[0] for r in store.records.all_records(NS, "workload/train")] == [NEW_ENV.id]


# ---- the commit protocol against a concurrent GC -----------------------------------------------------


class Pause:
    """Wrap ``obj.name`` (a real backend method) so that the first call stops until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, obj: Any, name: str, before: Callable[[], None] | None = None) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        original = getattr(obj, name)
        calls = [0]

        def paused(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                self.reached.set()
                assert self.go.wait(HANG_S)
                if before is not None:
                    before()
            return original(*args, **kwargs)

        monkeypatch.setattr(obj, name, paused)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # reported by the caller
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_gc_between_a_puts_blob_write_and_its_insert_leaves_the_blob(store: CacheStore, kernels: list[Kernel], monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a PUT of existing content can lose: the blob is already there (an orphan here),
    the PUT verified it, and a GC sweeps it as unreferenced before the PUT inserts its record."""
    k = kernels[0]
    d = _digest(k.pack)
    store.blobs.put(d, k.pack)  # an orphan: no record, no reference
    assert store.references.refs_complete()
    pause = Pause(monkeypatch, store.index, "put_if_absent")
    t, out = _in_thread(lambda: store.kernels.put(NS, k.key, k.pack))
    assert pause.reached.wait(HANG_S)
    # The PUT has claimed and verified the blob; GC now, as hard as it can.
    assert store.references.delete_blob_if_unreferenced(d) is False
    report = store.gc.run("elsewhere", GcRequest(orphans=True, min_age_s=0))
    assert report.orphans.entries == 0  # the blob is unnamed, but the PUT's claim is live
    assert store.blobs.size(d) == len(k.pack)
    pause.go.set()
    t.join(HANG_S)
    assert out and out[0][1] is True, out
    assert store.kernels.pack(NS, k.key)[1] == k.pack


def test_a_put_waits_for_a_gc_that_is_deleting_the_same_blob(store: CacheStore, kernels: list[Kernel], monkeypatch: pytest.MonkeyPatch) -> None:
    k = kernels[1]
    d = _digest(k.pack)
    store.blobs.put(d, k.pack)
    assert store.references.refs_complete()
    pause = Pause(monkeypatch, store.blobs, "delete")
    gc, gc_out = _in_thread(lambda: store.references.delete_blob_if_unreferenced(d))
    assert pause.reached.wait(HANG_S)  # the GC holds the deletion marker and is about to delete
    put, put_out = _in_thread(lambda: store.kernels.put(NS, k.key, k.pack))
    put.join(0.5)
    assert put.is_alive() and store.index.get(NS, KERNEL, k.key) is None  # waiting for the GC
    pause.go.set()
    gc.join(HANG_S)
    put.join(HANG_S)
    assert gc_out == [True] and put_out and put_out[0][1] is True, (gc_out, put_out)
    assert store.blobs.size(d) == len(k.pack)  # written again after the deletion
    assert store.kernels.pack(NS, k.key)[1] == k.pack


def test_a_put_rewrites_a_blob_that_a_stalled_gc_deleted_under_it(store: CacheStore, kernels: list[Kernel], monkeypatch: pytest.MonkeyPatch) -> None:
    """A GC whose deletion marker expired while it stalled deletes the blob between the PUT's
    verification and its insert: the PUT's check after the insert writes it back."""
    k = kernels[2]
    d = _digest(k.pack)
    pause = Pause(monkeypatch, store.index, "put_if_absent", before=lambda: store.blobs.delete(d))
    pause.go.set()
    _entry, created = store.kernels.put(NS, k.key, k.pack)
    assert created and pause.reached.is_set()
    assert store.blobs.size(d) == len(k.pack)
    assert store.kernels.pack(NS, k.key)[1] == k.pack


def test_a_get_racing_an_eviction_answers_the_whole_pack_or_a_miss(store: CacheStore, kernels: list[Kernel], monkeypatch: pytest.MonkeyPatch) -> None:
    k = kernels[3]
    store.kernels.put(NS, k.key, k.pack)
    pause = Pause(monkeypatch, store.blobs, "get")
    get, out = _in_thread(lambda: store.kernels.pack(NS, k.key))
    assert pause.reached.wait(HANG_S)  # the GET has the index record, not yet the bytes
    report = _gc(store, max_bytes=0, min_age_s=0)
    assert report.evicted["budget"].entries == 1 and report.blobs_deleted.entries == 1
    pause.go.set()
    get.join(HANG_S)
    assert len(out) == 1 and isinstance(out[0], NotFound), out  # a miss (404), never a 500
    assert store.index.get(NS, KERNEL, k.key) is None


def test_orphan_sweep_after_a_crash_mid_write(store: CacheStore, kernels: list[Kernel], tmp_path: Path) -> None:
    k, kept = kernels[4], kernels[0]
    store.kernels.put(NS, kept.key, kept.pack)
    d = _digest(k.pack)
    # A writer died after claiming and writing its blob, before inserting its record; another
    # died inside the blob write (a temp file).
    assert store.index.claim_blob(d, blob_ref(NS, KERNEL, k.key))
    store.blobs.put(d, k.pack)
    partial = tmp_path / "blobs" / "ab" / ".tmp-crashed"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"half a blob")
    # Soon after, the claim is a write in flight: kept whatever min age is asked.
    assert _gc(store, orphans=True, min_age_s=0).orphans.entries == 0
    assert store.blobs.size(d) == len(k.pack)
    later = time.time() + 2 * HOUR
    dry = _gc(store, now=later, orphans=True, dry_run=True)
    assert dry.orphans.entries == 1 and store.blobs.size(d) is not None
    report = _gc(store, now=later, orphans=True)
    assert report.orphans.entries == 1 and report.orphans.bytes == len(k.pack)
    assert store.blobs.size(d) is None and store.index.blob_refs([d]) == {}
    assert any("partial" in n for n in report.notes) and not partial.exists()
    assert store.kernels.pack(NS, kept.key)[1] == kept.pack


def test_records_from_before_references_are_backfilled_before_any_blob_is_deleted(store: CacheStore, kernels: list[Kernel]) -> None:
    """An index written by a kcache without blob references: the first GC adds them, so an
    eviction in one namespace never deletes a blob another namespace's old record names."""
    k = kernels[0]
    store.kernels.put(NS, k.key, k.pack)
    store.kernels.put("legacy", k.key, k.pack)
    d = _digest(k.pack)
    for ns in (NS, "legacy"):  # forget the references, as an old index would have none
        ref = blob_ref(ns, KERNEL, k.key)
        assert store.index.release_blob(d, ref, store.index.blob_refs([d])[d][ref])
    fresh = CacheStore(store.blobs, store.index, PackLimits())
    try:
        # The flag says references are complete; an index from before would not have it.
        _clear_refs_flag(fresh.index)
        assert not fresh.references.refs_complete()
        assert fresh.references.delete_blob_if_unreferenced(d) is False  # nothing deleted before a backfill
        report = fresh.gc.run(NS, GcRequest(max_bytes=0, min_age_s=0))
        assert any("backfilled 2 blob references" in n for n in report.notes), report.notes
        assert report.blobs_shared == 1 and fresh.blobs.size(d) == len(k.pack)
        assert fresh.kernels.pack("legacy", k.key)[1] == k.pack
    finally:
        fresh.access.close()


def _clear_refs_flag(index: Index) -> None:
    from kcache_server.storage.redis_index import RedisIndex
    from kcache_server.storage.sqlite_index import SqliteIndex

    if isinstance(index, SqliteIndex):
        index._query("DELETE FROM flags")
    elif isinstance(index, RedisIndex):
        index._run(lambda r: r.delete(f"{index.prefix}:flags"))


def test_one_gc_at_a_time(store: CacheStore) -> None:
    assert store.index.acquire_lease("gc", "another-replica", 30)
    with pytest.raises(GcBusy):
        _gc(store)
    assert store.gc.run_policies() == []
    store.index.release_lease("gc", "another-replica")
    assert _gc(store).namespace == NS


# ---- the fill test: soft and hard limits with a working set read throughout -------------------------


def test_fill_past_soft_and_hard_limits_keeps_the_working_set_and_the_budget(store: CacheStore, kernels: list[Kernel]) -> None:
    """Writers fill the namespace with real kernels and entries well past its hard limit while a
    reader reads a working set and a GC runs in a loop: the working set is never lost, usage
    never passes the hard limit, every read answers the bytes written, and the GC brings usage
    under the soft limit."""
    items = [("kernel", k.key, k.pack) for k in kernels] + [("entry", key, data) for key, data in _entries(kernels, 24)]
    total = sum(len(d) for _, _, d in items)
    soft, hard = total // 3, total // 2

    def rules(min_age: float) -> RetentionConfig:
        return RetentionConfig.model_validate({"default": {"soft_limit": soft, "hard_limit": hard, "min_age": min_age}})

    store.retention = rules(HANG_S)  # the burst's: see below
    working = [items[0], items[len(kernels)]]  # one kernel, one entry
    for kind, key, data in working:
        _put(store, kind, key, data)
    stop = threading.Event()
    problems: list[str] = []
    peak = [0]
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            for kind, key, data in working:
                try:
                    got = store.kernels.pack(NS, key)[1] if kind == "kernel" else store.entries.read(NS, "fx-graph", key)[1]
                except Exception as exc:
                    problems.append(f"working set {key}: {exc!r}")
                    continue
                reads[0] += 1
                if got != data:
                    problems.append(f"{key}: torn answer")
            time.sleep(0.02)

    evicted: list[int] = []

    def collector() -> None:
        c = store.gc
        while not stop.is_set():
            try:  # the store's collector reads the rules the test has set by then, at each pass
                evicted.extend(sum(a.entries for a in r.evicted.values()) for r in c.run_policies())
            except Exception as exc:
                problems.append(f"gc: {exc!r}")
            peak[0] = max(peak[0], store.records.cache_usage(NS).bytes)
            time.sleep(0.05)

    threads = [threading.Thread(target=reader), threading.Thread(target=collector)]
    for t in threads:
        t.start()
    refused = [0]

    def offer(kind: str, key: str, data: bytes) -> None:
        try:
            _put(store, kind, key, data)
        except InsufficientStorage as exc:
            refused[0] += 1
            assert "hard limit" in str(exc)
        peak[0] = max(peak[0], store.records.cache_usage(NS).bytes)

    try:
        time.sleep(0.1)
        # A burst faster than items pass the min age (the hard limit refuses), then a steady
        # stream (the GC makes room as items age); evicted items come back in the second round.
        # The burst's min age is one no machine outruns: at load 12 a burst took longer than the
        # stream's 0.5 s, the GC evicted its first items and the hard limit never refused.
        for item in items:
            offer(*item)
        store.retention = rules(0.5)
        for item in items:
            offer(*item)
            time.sleep(0.04)
        # Until the GC has brought usage under the soft limit and the reader has read throughout
        # (a hang guard, not a bound: a loaded machine takes longer).
        deadline = time.monotonic() + HANG_S
        while (store.records.cache_usage(NS).bytes > soft or reads[0] <= 20) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(HANG_S)
    assert not problems, problems[:5]
    assert reads[0] > 20 and refused[0] > 0 and sum(evicted) >= len(items) // 2, (reads, refused, sum(evicted))
    assert peak[0] <= hard, (peak[0], hard)
    assert store.records.cache_usage(NS).bytes <= soft
    for kind, key, data in working:  # survived every GC
        assert (store.kernels.pack(NS, key)[1] if kind == "kernel" else store.entries.read(NS, "fx-graph", key)[1]) == data
    _assert_consistent(store)


def _put(store: CacheStore, kind: str, key: str, data: bytes) -> None:
    if kind == "kernel":
        store.kernels.put(NS, key, data)
    else:
        store.entries.put(NS, "fx-graph", key, data, Producer())


def _assert_consistent(store: CacheStore) -> None:
    """No record without its blob, no blob without a reference from a record."""
    named: set[str] = set()
    for ns, kinds in store.index.usage().items():
        for kind in kinds:
            for r in store.records.all_records(ns, kind):
                if r.digest:
                    assert store.blobs.size(r.digest) == r.size, f"{kind} {r.key}: record without its blob"
                    named.add(r.digest)
    stored = {b.digest for b in store.blobs.scan()}
    assert named <= stored
    refs = store.index.blob_refs(sorted(stored))
    assert set(refs) == named, "a blob with no record references is a leak; a named blob without references could be deleted"


# ---- the REST API, the settings, the CLI, the metrics ----------------------------------------------------


def _retention_app(tmp_path: Path, **extra: Any) -> Settings:
    rules = {"default": {"soft_limit": "20kB", "hard_limit": "30kB", "min_age": 0}, "gc_interval": "1h", "orphan_interval": None}
    return Settings(data_dir=tmp_path / "svc", access_flush_s=0.05, retention=json.dumps(rules), **extra)


def test_an_upload_past_the_hard_limit_is_507_and_wakes_the_gc(tmp_path: Path, kernels: list[Kernel]) -> None:
    with TestClient(create_app(_retention_app(tmp_path))) as c:
        codes = []
        for k in kernels:
            r = c.put(f"/v1/{NS}/kernels/{k.key}", content=k.pack)
            codes.append(r.status_code)
            if r.status_code == 507:
                err = r.json()["error"]
                assert err["code"] == "insufficient_storage" and "hard limit" in err["message"] and "30.0 kB" in err["message"]
                break
        assert codes[-1] == 507 and set(codes[:-1]) == {201}, codes
        deadline = time.monotonic() + HANG_S  # the pressure GC (interval 1h) brings usage under the soft limit
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = c.get(f"/v1/{NS}/gc").json()
            if status["last_run"] and status["usage"]["bytes"] <= 20_000:
                break
            time.sleep(0.1)
        assert status["last_run"]["trigger"] == "pressure", status
        assert status["policy"] == {"soft_limit_bytes": 20000, "hard_limit_bytes": 30000, "min_age_s": 0.0, "ttl_s": None, "env_idle_s": None}
        k = kernels[len(codes) - 1]
        assert c.put(f"/v1/{NS}/kernels/{k.key}", content=k.pack).status_code == 201
        metrics = c.get("/metrics").text
        assert 'kcache_gc_runs_total{trigger="pressure"}' in metrics
        assert f'kcache_storage_budget_bytes{{limit="hard",namespace="{NS}"}} 30000.0' in metrics
        assert f'kcache_gc_evicted_entries_total{{namespace="{NS}",reason="budget"}}' in metrics
        assert f'kcache_storage_oldest_item_age_seconds{{namespace="{NS}"}}' in metrics


def test_a_full_namespace_refuses_uploads_but_never_opens_the_clients_breaker(tmp_path: Path, kernels: list[Kernel]) -> None:
    """507 is the service answering: counting it as a failure opened the breaker after three
    refused uploads, and the job's reads stopped too."""
    from kcache.config import ClientConfig
    from kcache.exceptions import StorageFull
    from kcache.transport.http import KcacheClient
    from live import LiveService

    first = kernels[0]
    room = len(first.pack) + 16  # the first kernel fits, no second one does
    rules = {"default": {"soft_limit": room, "hard_limit": room, "min_age": "1h"}, "gc_interval": "1h", "orphan_interval": None}
    with LiveService(tmp_path / "svc", retention=json.dumps(rules)) as svc:
        assert httpx.put(f"{svc.url}/v1/{NS}/kernels/{first.key}", content=first.pack, timeout=HANG_S).status_code == 201
        client = KcacheClient(ClientConfig(url=svc.url, namespace=NS, breaker_failures=2))
        try:
            for k in kernels[1:]:
                with pytest.raises(StorageFull, match="hard limit"):
                    client.put_pack(k.key, k.pack)
            assert len(kernels) - 1 > client.config.breaker_failures
            assert client.breaker.state == "closed"
            assert client.get_pack(first.key) == first.pack  # reads go on
        finally:
            client.close()


def test_gc_and_pins_over_rest_need_admin(tmp_path: Path, kernels: list[Kernel]) -> None:
    tokens = json.dumps([{"token": ADMIN_TOKEN, "scopes": ["admin"]}, {"token": WRITE_TOKEN, "scopes": ["write"]}])
    settings = Settings(data_dir=tmp_path / "svc", tokens=tokens)
    admin, writer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}, {"Authorization": f"Bearer {WRITE_TOKEN}"}
    with TestClient(create_app(settings)) as c:
        for k in kernels[:3]:
            assert c.put(f"/v1/{NS}/kernels/{k.key}", content=k.pack, headers=writer).status_code == 201
        assert c.post(f"/v1/{NS}/gc", json={"max_bytes": 0}, headers=writer).status_code == 403
        assert c.put(f"/v1/{NS}/pins/serving", headers=writer).status_code == 403
        dry = c.post(f"/v1/{NS}/gc", json={"max_bytes": 0, "min_age_s": 0, "dry_run": True}, headers=admin)
        assert dry.status_code == 200 and dry.json()["planned"]["budget"]["entries"] == 3 and dry.json()["evicted"] == {}
        assert c.get(f"/v1/{NS}/kernels", headers=writer).json()["items"]  # nothing deleted
        bad = c.post(f"/v1/{NS}/gc", json={"env": "cuda"}, headers=admin)
        assert bad.status_code == 400 and "field=value" in bad.json()["error"]["message"]
        assert c.post(f"/v1/{NS}/gc", json={"max_bytes": -1}, headers=admin).status_code == 422
        unknown = c.put(f"/v1/{NS}/pins/serving", headers=admin)  # no run of it is published: a typo?
        assert unknown.status_code == 404 and "?ahead=true" in unknown.json()["error"]["message"]
        assert c.put(f"/v1/{NS}/pins/serving?ahead=true", headers=admin).status_code == 201
        assert c.put(f"/v1/{NS}/pins/serving?ahead=true", headers=admin).status_code == 200
        assert [p["workload"] for p in c.get(f"/v1/{NS}/pins", headers=writer).json()["items"]] == ["serving"]
        c.app.state.store.index.acquire_lease("gc", "another-replica", 30)  # type: ignore[attr-defined]
        busy = c.post(f"/v1/{NS}/gc", json={}, headers=admin)
        assert busy.status_code == 409 and "another GC" in busy.json()["error"]["message"]
        c.app.state.store.index.release_lease("gc", "another-replica")  # type: ignore[attr-defined]
        done = c.post(f"/v1/{NS}/gc", json={"max_bytes": 0, "min_age_s": 0}, headers=admin).json()
        assert done["evicted"]["budget"]["entries"] == 3 and done["pins"] == ["serving"]
        assert c.get(f"/v1/{NS}/kernels", headers=writer).json()["items"] == []
        assert c.get(f"/v1/{NS}/gc", headers=writer).json()["last_run"]["evicted"]["budget"]["entries"] == 3
        assert c.delete(f"/v1/{NS}/pins/serving", headers=admin).status_code == 204
        assert c.delete(f"/v1/{NS}/pins/serving", headers=admin).status_code == 404


@pytest.mark.parametrize(("rules", "message"), [
    ('{"default": {"soft_limit": "lots"}}', "KCACHE_RETENTION: default.soft_limit: 'lots': not a size"),
    ('{"namespaces": {"ci": {"soft_limit": "2GB", "hard_limit": "1GB"}}}', "soft_limit (2000000000) is above hard_limit"),
    ('{"default": {"hard_limit": "1GB"}, "namespaces": {"ci": {"soft_limit": "2GB"}}}', "namespaces.ci: soft limit 2000000000 is above the hard limit"),
    ('{"defaults": {}}', "KCACHE_RETENTION: defaults: Extra inputs are not permitted"),
    ('{"namespaces": {"Bad Name": {}}}', "namespace 'Bad Name'"),
    ('{"default": {"ttl": "a week"}}', "not a duration"),
    ("{", "KCACHE_RETENTION: not JSON"),
])
def test_invalid_retention_settings_stop_start_up_with_one_line(rules: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(retention=rules)
    assert message in str(info.value)


def test_serve_refuses_invalid_retention_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from kcache_testkit.service import clean_env

    env = clean_env(KCACHE_RETENTION='{"default": {"min_age": "soon"}}')
    proc = subprocess.run([sys.executable, "-m", "kcache.cli", "serve", "--data-dir", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "kcache: invalid settings: KCACHE_RETENTION: default.min_age: 'soon': not a duration; use a number with a unit: "
        "500ms, 90s, 30m, 12h, 7d, 2w, or combined: 1h30m; a bare number is seconds"]


def test_policy_merges_namespace_over_default() -> None:
    cfg = RetentionConfig.model_validate({"default": {"hard_limit": "10GiB", "min_age": "2h"}, "namespaces": {"ci": {"soft_limit": "1GB", "hard_limit": "2GB", "ttl": "7d"}}})
    assert cfg.policy("anything").model_dump() == {"soft_limit_bytes": int(0.9 * (10 << 30)), "hard_limit_bytes": 10 << 30, "min_age_s": 7200.0, "ttl_s": None, "env_idle_s": None}
    assert cfg.policy("ci").model_dump() == {"soft_limit_bytes": 10**9, "hard_limit_bytes": 2 * 10**9, "min_age_s": 7200.0, "ttl_s": 7 * 86400.0, "env_idle_s": None}
    assert not RetentionConfig().active and cfg.active
    assert (parse_bytes("1.5GB"), parse_bytes("512MiB"), parse_bytes(7)) == (1_500_000_000, 512 << 20, 7)
    assert (parse_duration("1h30m"), parse_duration("2w"), parse_duration("90")) == (5400.0, 14 * 86400.0, 90.0)


def test_cli_gc_prints_the_plan_then_runs_it_and_pins(tmp_path: Path, kernels: list[Kernel], capsys: pytest.CaptureFixture[str]) -> None:
    from kcache.cli.commands import main
    from live import LiveService

    with LiveService(tmp_path / "svc") as svc:
        for k in kernels:
            assert httpx.put(f"{svc.url}/v1/{NS}/kernels/{k.key}", content=k.pack, timeout=HANG_S).status_code == 201
        manifest = WorkloadManifest(name="serving", fingerprint=NEW_ENV, kernels=[kernels[0].key])
        assert httpx.put(f"{svc.url}/v1/{NS}/workloads/serving", json=manifest.model_dump(mode="json"), timeout=HANG_S).status_code == 201
        remote = ["--url", svc.url, "--namespace", NS]
        assert main(["pin", "serving", *remote]) == 0
        assert "pinned workload 'serving'" in capsys.readouterr().out
        assert main(["gc", *remote, "--max-bytes", "20kB", "--min-age", "0", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "(dry run: nothing is deleted)" in out and "budget" in out and "down to 20.0 kB" in out and "first evictions" in out
        assert len(httpx.get(f"{svc.url}/v1/{NS}/kernels", timeout=HANG_S).json()["items"]) == len(kernels)
        assert main(["gc", *remote, "--max-bytes", "20kB", "--min-age", "0", "--yes"]) == 0
        out = capsys.readouterr().out
        assert "done      evicted" in out and "blobs deleted" in out
        left = httpx.get(f"{svc.url}/v1/{NS}/kernels", timeout=HANG_S).json()["items"]
        assert sum(k["pack_size"] for k in left) <= 20_000 and kernels[0].key in {k["key"] for k in left}  # pinned
        assert main(["unpin", "serving", *remote]) == 0
        assert main(["pin", *remote]) == 0
        assert "0 pinned workloads" in capsys.readouterr().err
        with pytest.raises(SystemExit) as usage:
            main(["gc", *remote, "--max-bytes", "lots"])
        assert usage.value.code == 2 and "argument --max-bytes: 'lots': not a size" in capsys.readouterr().err
