"""One conformance suite, run against every storage backend (the fsspec habit).

The ``blob_store`` and ``index`` fixtures (tests/conftest.py) are parameterised over every
backend this machine can run; each backend gets exactly these tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import threading
import time

import pytest
from kcache_server.storage import BackendUnavailable, BlobNotFound, BlobStore, Index, IndexRecord
from kcache_server.storage.base import KindUsage

from kcache_testkit.pace import HANG_S


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _rec(key: str, ns: str = "ns1", kind: str = "kernel", digest: str = "a" * 64, size: int = 3) -> IndexRecord:
    return IndexRecord(namespace=ns, kind=kind, key=key, digest=digest, size=size, meta=json.dumps({"k": key}))


# ---- blob store -------------------------------------------------------------------------


def test_blob_roundtrip_and_size(blob_store: BlobStore) -> None:
    data = b"kernel bytes" * 1000
    d = _digest(data)
    assert blob_store.size(d) is None
    blob_store.put(d, data)
    assert blob_store.get(d) == data
    assert blob_store.size(d) == len(data)


def test_blob_missing_raises_not_found(blob_store: BlobStore) -> None:
    with pytest.raises(BlobNotFound):
        blob_store.get(_digest(b"never stored"))


def test_blob_put_is_idempotent(blob_store: BlobStore) -> None:
    data = b"same"
    d = _digest(data)
    blob_store.put(d, data)
    blob_store.put(d, data)
    assert blob_store.get(d) == data


def test_blob_delete(blob_store: BlobStore) -> None:
    data = b"to delete"
    d = _digest(data)
    blob_store.put(d, data)
    blob_store.delete(d)
    assert blob_store.size(d) is None
    blob_store.delete(d)  # absent is fine


def test_blob_large_roundtrip(blob_store: BlobStore) -> None:
    # Large enough to take the multipart path in backends that have one.
    data = bytes(range(256)) * (40 * 1024 * 4)  # 40 MiB
    d = _digest(data)
    blob_store.put(d, data)
    assert blob_store.size(d) == len(data)
    assert _digest(blob_store.get(d)) == d


def test_blob_concurrent_writers_same_digest(blob_store: BlobStore) -> None:
    data = b"x" * 300_000
    d = _digest(data)
    errors: list[BaseException] = []

    def put() -> None:
        try:
            blob_store.put(d, data)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=put) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert blob_store.get(d) == data


def test_blob_ping(blob_store: BlobStore) -> None:
    blob_store.ping()


# ---- streamed reads (issue #31: N readers of a large blob hold a chunk each) ----------------------


def test_blob_open_streams_the_bytes_in_bounded_chunks(blob_store: BlobStore) -> None:
    data = random.Random(31).randbytes(3 * (1 << 20) + 12345)  # several chunks and a short tail
    d = _digest(data)
    blob_store.put(d, data)
    with blob_store.open(d, chunk_size=64 << 10) as stream:
        assert stream.size == len(data)
        chunks = list(stream)
    assert all(0 < len(c) <= 64 << 10 for c in chunks) and len(chunks) >= len(data) // (64 << 10)
    assert b"".join(chunks) == data
    with blob_store.open(d) as stream:  # the default chunk size, read whole
        assert stream.read() == data


def test_blob_open_missing_raises_not_found_at_once(blob_store: BlobStore) -> None:
    with pytest.raises(BlobNotFound):
        blob_store.open(_digest(b"never stored"))


def test_blob_open_closed_early_releases_what_it_holds(blob_store: BlobStore) -> None:
    """Readers that stop halfway (a client that went away) and close: many more of them than a
    connection pool holds, and the store still answers."""
    data = bytes(range(256)) * 4096  # 1 MiB
    d = _digest(data)
    blob_store.put(d, data)
    for _ in range(40):
        stream = blob_store.open(d, chunk_size=4096)
        assert len(next(iter(stream))) <= 4096
        stream.close()
        stream.close()  # twice is harmless
    assert blob_store.get(d) == data


def test_blob_open_of_a_blob_deleted_meanwhile_never_yields_other_bytes(blob_store: BlobStore) -> None:
    """A GC may delete a blob while a reader streams it: the reader gets the whole blob or a
    BackendUnavailable (the file store: always the whole blob), never a short or other body
    passed off as complete."""
    data = random.Random(7).randbytes(2 << 20)
    d = _digest(data)
    blob_store.put(d, data)
    stream = blob_store.open(d, chunk_size=64 << 10)
    first = next(iter(stream))
    blob_store.delete(d)
    try:
        rest = stream.read()
    except BackendUnavailable:
        assert blob_store.name != "file"
    else:
        assert first + rest == data
    finally:
        stream.close()


# ---- index ------------------------------------------------------------------------------


def test_index_put_if_absent_first_writer_wins(index: Index) -> None:
    first = index.put_if_absent(_rec("K1", digest="1" * 64))
    second = index.put_if_absent(_rec("K1", digest="2" * 64))
    assert first.digest == "1" * 64
    assert second.digest == "1" * 64
    got = index.get("ns1", "kernel", "K1")
    assert got is not None and got.digest == "1" * 64 and json.loads(got.meta) == {"k": "K1"}


def test_index_get_absent(index: Index) -> None:
    assert index.get("ns1", "kernel", "nope") is None


def test_index_namespaces_and_kinds_are_separate(index: Index) -> None:
    index.put_if_absent(_rec("K", ns="a"))
    assert index.get("b", "kernel", "K") is None
    assert index.get("a", "entry/fx-graph", "K") is None
    assert index.get("a", "kernel", "K") is not None


def test_index_get_many_and_missing(index: Index) -> None:
    keys = [f"K{i:05d}" for i in range(1200)]  # more than one chunk / pipeline batch
    for k in keys[::2]:
        index.put_if_absent(_rec(k))
    found = index.get_many("ns1", "kernel", keys)
    assert set(found) == set(keys[::2])
    assert index.missing("ns1", "kernel", keys) == keys[1::2]


def test_index_concurrent_put_if_absent_one_winner(index: Index) -> None:
    results: list[IndexRecord] = []
    lock = threading.Lock()

    def put(i: int) -> None:
        r = index.put_if_absent(_rec("RACE", digest=f"{i:064x}"))
        with lock:
            results.append(r)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.digest for r in results}) == 1  # everybody saw the same winner


def test_index_upsert_overwrites(index: Index) -> None:
    index.upsert(_rec("U", digest="1" * 64))
    index.upsert(_rec("U", digest="2" * 64))
    got = index.get("ns1", "kernel", "U")
    assert got is not None and got.digest == "2" * 64


def test_index_delete_and_compare_and_delete(index: Index) -> None:
    index.put_if_absent(_rec("D", digest="1" * 64))
    assert index.delete("ns1", "kernel", "D", digest="2" * 64) is False  # someone else's
    assert index.get("ns1", "kernel", "D") is not None
    assert index.delete("ns1", "kernel", "D", digest="1" * 64) is True
    assert index.get("ns1", "kernel", "D") is None
    assert index.delete("ns1", "kernel", "D") is False


def test_index_list_pagination_and_prefix(index: Index) -> None:
    keys = sorted(f"{p}{i:03d}" for p in ("AA", "AB") for i in range(30))
    for k in keys:
        index.put_if_absent(_rec(k))
    seen: list[str] = []
    after = ""
    while True:
        page = index.list("ns1", "kernel", after=after, limit=7)
        if not page:
            break
        seen += [r.key for r in page]
        after = page[-1].key
    assert seen == keys
    assert [r.key for r in index.list("ns1", "kernel", prefix="AB", limit=100)] == [k for k in keys if k.startswith("AB")]
    full, lean = index.list("ns1", "kernel", limit=3), index.list("ns1", "kernel", limit=3, meta=False)
    assert [r.meta for r in lean] == ["", "", ""] and [dataclasses.replace(r, meta="") for r in full] == lean


def test_index_touch_counts_hits(index: Index) -> None:
    index.put_if_absent(_rec("T"))
    now = time.time()
    index.touch("ns1", "kernel", ["T", "T", "absent"], now)
    got = index.get("ns1", "kernel", "T")
    assert got is not None and got.hits == 2 and got.last_access == pytest.approx(now, abs=1)


def test_index_usage(index: Index) -> None:
    index.put_if_absent(_rec("U1", ns="u", size=10))
    index.put_if_absent(_rec("U2", ns="u", size=32))
    index.put_if_absent(_rec("E1", ns="u", kind="entry/fx-graph", size=5))
    usage = index.usage()["u"]
    assert (usage["kernel"].entries, usage["kernel"].bytes) == (2, 42)
    assert (usage["entry/fx-graph"].entries, usage["entry/fx-graph"].bytes) == (1, 5)


def test_index_ping(index: Index) -> None:
    index.ping()


# ---- added with the S3 and Redis backends (production storage) -----------------------------


def test_blob_presigned_url_serves_the_bytes(blob_store: BlobStore) -> None:
    import urllib.request

    data = b"presigned download" * 100
    d = _digest(data)
    blob_store.put(d, data)
    url = blob_store.presigned_get_url(d, 60)
    if url is None:  # optional in the contract (the embedded file store has none)
        return
    with urllib.request.urlopen(url, timeout=HANG_S) as resp:
        assert resp.read() == data


def test_index_ids_with_separator_characters(index: Index) -> None:
    # Backends that build one string key out of (namespace, kind, key) must not let
    # separators in the parts make two ids collide.
    ids = [("a", "entry/x", "k:1"), ("a", "entry/x:k", "1"), ("a:entry", "x", "k:1"),
           ("a", "entry", "x:k:1"), ("a", "run/{r}", "k|1{x}"), ("a|run", "{r}", "k")]
    for i, (ns, kind, key) in enumerate(ids):
        index.put_if_absent(_rec(key, ns=ns, kind=kind, digest=f"{i:064x}"))
    for i, (ns, kind, key) in enumerate(ids):
        got = index.get(ns, kind, key)
        assert got is not None and got.digest == f"{i:064x}"
        assert [r.key for r in index.list(ns, kind)] == [key]
    usage = index.usage()
    assert sum(k.entries for kinds in usage.values() for k in kinds.values()) == len(ids)


def test_index_usage_follows_upserts_and_deletes(index: Index) -> None:
    index.put_if_absent(_rec("A", ns="v", size=10))
    index.put_if_absent(_rec("B", ns="v", size=20))
    index.upsert(_rec("B", ns="v", size=25))  # replaces B's size
    index.upsert(_rec("C", ns="v", size=5))  # a new record
    index.put_if_absent(_rec("A", ns="v", size=999))  # loses: A stays 10 bytes
    assert index.usage()["v"]["kernel"] == KindUsage(3, 40)
    assert index.delete("v", "kernel", "A")
    assert not index.delete("v", "kernel", "A")
    assert index.usage()["v"]["kernel"] == KindUsage(2, 30)
    index.delete("v", "kernel", "B")
    index.delete("v", "kernel", "C")
    assert "kernel" not in index.usage().get("v", {})


def test_index_records_without_a_blob_delete_and_evict(index: Index) -> None:
    """Markers, pins and quarantine reports hold no blob (digest "", size 0). Redis's delete
    scripts once decremented the byte count by ``-0``, which Lua spells "-0" and HINCRBY refuses."""
    index.put_if_absent(_rec("Q", ns="z", kind="quarantine/dynamo", digest="", size=0))
    index.put_if_absent(_rec("P", ns="z", kind="pin", digest="", size=0))
    assert index.usage()["z"]["quarantine/dynamo"] == KindUsage(1, 0)
    assert index.delete("z", "quarantine/dynamo", "Q") is True
    assert index.get("z", "quarantine/dynamo", "Q") is None
    assert "quarantine/dynamo" not in index.usage().get("z", {})
    (pin,) = index.list("z", "pin")
    assert index.delete_unused([pin]) == [True]
    assert "pin" not in index.usage().get("z", {})


# ---- retention: eviction, blob references, deletion markers, leases -----------------------------


def test_blob_scan_lists_every_blob(blob_store: BlobStore) -> None:
    t0 = time.time()
    blobs = {_digest(d): d for d in (b"first blob", b"second blob" * 100)}
    for d, data in blobs.items():
        blob_store.put(d, data)
    found = {b.digest: b for b in blob_store.scan()}
    assert set(found) == set(blobs)
    for d, data in blobs.items():
        assert found[d].size == len(data)
        assert t0 - 60 < found[d].modified < time.time() + 60  # the store's clock, not ours
    gone = next(iter(blobs))
    blob_store.delete(gone)
    assert {b.digest for b in blob_store.scan()} == set(blobs) - {gone}
    rest = sorted(set(blobs) - {gone})
    assert sorted(blob_store.delete_many([*rest, gone])) == sorted([*rest, gone])  # absent counts as gone
    assert list(blob_store.scan()) == []


def test_index_delete_unused_spares_what_was_used_or_replaced(index: Index) -> None:
    for key, size in (("OLD", 10), ("READ", 20), ("REPLACED", 30)):
        index.put_if_absent(_rec(key, ns="ev", size=size, digest="1" * 64))
    seen = {r.key: r for r in index.list("ev", "kernel")}
    index.touch("ev", "kernel", ["READ"], seen["READ"].last_used + 5)  # a hit flushed after the GC read it
    index.delete("ev", "kernel", "REPLACED")
    index.put_if_absent(_rec("REPLACED", ns="ev", size=30, digest="2" * 64))  # re-uploaded meanwhile
    assert index.delete_unused([seen["OLD"], seen["READ"], seen["REPLACED"]]) == [True, False, False]
    assert index.get("ev", "kernel", "OLD") is None
    assert index.get("ev", "kernel", "READ") is not None and index.get("ev", "kernel", "REPLACED") is not None
    assert index.usage()["ev"]["kernel"] == KindUsage(2, 50)
    assert index.delete_unused([seen["OLD"]]) == [False]  # already gone
    assert [r.key for r in index.list("ev", "kernel")] == ["READ", "REPLACED"]


def test_index_blob_refs_guard_deletion(index: Index) -> None:
    d = "c" * 64
    t1 = index.claim_blob(d, "ref-a")
    t2 = index.claim_blob(d, "ref-b")
    assert t1 and t2 and t1 != t2
    assert index.blob_refs([d, "e" * 64]) == {d: {"ref-a": t1, "ref-b": t2}}
    assert not index.begin_blob_delete(d, "gc-1", 30)  # referenced
    assert not index.release_blob(d, "ref-a", t2)  # another claim's token: kept
    assert index.release_blob(d, "ref-a", t1)
    t3 = index.claim_blob(d, "ref-b")  # the same ref claimed again (a re-upload): newest token wins
    assert t3 and not index.release_blob(d, "ref-b", t2 or "")
    assert index.release_blob(d, "ref-b", t3)
    assert index.blob_refs([d]) == {}
    assert index.begin_blob_delete(d, "gc-1", 30)
    assert not index.begin_blob_delete(d, "gc-2", 30)  # one deletion at a time
    assert index.claim_blob(d, "ref-c") is None  # a writer waits while the blob is being deleted
    index.end_blob_delete(d, "gc-2")  # not ours: no effect
    assert index.claim_blob(d, "ref-c") is None
    index.end_blob_delete(d, "gc-1")
    assert index.claim_blob(d, "ref-c") is not None
    d2 = "f" * 64
    assert index.begin_blob_delete(d2, "gc-3", 0.2)  # a GC that died: its marker expires
    time.sleep(0.4)
    assert index.claim_blob(d2, "ref-d") is not None


def test_index_blob_ref_batches(index: Index) -> None:
    free, held = "1" * 64, "2" * 64
    token = index.claim_blob(held, "r")
    assert token is not None
    assert index.begin_blob_deletes([free, held], "gc", 30) == [True, False]
    assert index.claim_blob(free, "w") is None
    index.end_blob_deletes([free, held], "gc")
    t2 = index.claim_blob(free, "w")
    assert t2 is not None
    assert index.release_blobs([(held, "r", token), (free, "w", "stale"), (free, "w", t2)]) == [True, False, True]
    assert index.blob_refs([free, held]) == {}


def test_index_backfill_blob_refs_keeps_live_claims(index: Index) -> None:
    d = "d" * 64
    token = index.claim_blob(d, "live")
    assert not index.blob_refs_complete()
    assert index.backfill_blob_refs([(d, "live"), (d, "old"), ("9" * 64, "old")]) == 2
    assert index.blob_refs([d])[d]["live"] == token
    assert set(index.blob_refs([d])[d]) == {"live", "old"}
    index.set_blob_refs_complete()
    assert index.blob_refs_complete()


def test_index_lease_one_holder_at_a_time(index: Index) -> None:
    assert index.acquire_lease("gc", "replica-a", 30)
    assert not index.acquire_lease("gc", "replica-b", 30)
    assert index.acquire_lease("gc", "replica-a", 30)  # renewal
    assert index.acquire_lease("other", "replica-b", 30)  # leases are by name
    index.release_lease("gc", "replica-b")  # not the holder: no effect
    assert not index.acquire_lease("gc", "replica-b", 30)
    index.release_lease("gc", "replica-a")
    assert index.acquire_lease("gc", "replica-b", 0.2)
    time.sleep(0.4)  # the holder died without releasing: the lease expires
    assert index.acquire_lease("gc", "replica-a", 30)
