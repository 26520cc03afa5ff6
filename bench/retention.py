"""Retention costs: Redis memory per 1,000 index entries, and a GC pass over 100,000 entries.

* **Memory.** A private ``redis-server``; ``used_memory`` (INFO) before and after writing
  ``--memory-sample`` kernel records through the index's real ``put_if_absent`` script, then
  their blob references through the real ``claim_blob`` script, then as many entry records
  (``fx-graph``). Records carry real metadata: the ``KernelEntry`` JSON of real sm_90 kernels
  compiled by Triton on the CPU (``kcache_testkit.corpus.compile_small``), under distinct keys; entries the
  ``EntryInfo`` JSON the service writes. Reported per 1,000 and as a ratio to the metadata's own
  bytes (what Redis adds on top of the JSON it stores).
* **GC over ``--entries`` (100,000) kernel records** in one namespace, on Redis and on SQLite,
  each record with its blob reference; the 10 % least recently used have real blobs in a file
  store on tmpfs. Baseline, measured in the same run on the same data: paging through every
  record's key, size and times (``CacheStore.iter_records(meta=False)``), the read any GC must do. Then the GC's plan (a dry run
  with a budget that evicts 10 %; median of ``--repeats``) as a ratio to that baseline; then the
  eviction itself (conditional deletes batched per slot, references released, blobs deleted
  under the deletion marker) against the baseline of deleting as many records one by one with
  the index's plain ``delete`` (what an admin's DELETE costs, without any blob work).

    python -m bench.retention [--entries 100000] [--memory-sample 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common

NS = "bench"


def _real_metas(n_kernels: int = 4) -> list[Any]:
    from kcache_schemas.pack import pack_kernel_dir
    from kcache_server.store.kernel_packs import kernel_entry_of

    from kcache_testkit.corpus import compile_small

    root = Path(tempfile.mkdtemp(prefix="kcache-bench-ret-"))
    try:
        dirs = compile_small(root, count=n_kernels, arch=90)
        out = []
        for d in dirs:
            manifest, pack = pack_kernel_dir(d)
            out.append(kernel_entry_of(NS, manifest, len(pack)))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _key(i: int) -> str:
    from kcache_schemas.keys import hex_to_kernel_key

    return hex_to_kernel_key(hashlib.sha256(f"kernel-{i}".encode()).hexdigest())


def _blob(i: int) -> tuple[str, bytes]:
    data = f"pack-{i}".encode() * 8
    return hashlib.sha256(data).hexdigest(), data


def _kernel_record(i: int, metas: list[Any], created_at: float) -> Any:
    from kcache_server.storage import IndexRecord

    key = _key(i)
    entry = metas[i % len(metas)].model_copy(update={"key": key})
    digest, _data = _blob(i)
    return IndexRecord(namespace=NS, kind="kernel", key=key, digest=digest, size=entry.pack_size,
                       meta=entry.model_dump_json(), created_at=created_at)


def _entry_record(i: int) -> Any:
    from datetime import datetime, timezone

    from kcache_schemas import EntryInfo, Producer
    from kcache_server.storage import IndexRecord

    key = f"pt2:fx-graph-v1::{hashlib.sha256(str(i).encode()).hexdigest()[:52]}"
    digest = hashlib.sha256(f"entry-{i}".encode()).hexdigest()
    info = EntryInfo(namespace=NS, layer="fx-graph", key=key, size=180_000, sha256=digest,
                     created_at=datetime.now(timezone.utc), producer=Producer(kcache_version="0.1.0", compile_time_s=4.2))
    return IndexRecord(namespace=NS, kind="entry/fx-graph", key=key, digest=digest, size=info.size, meta=info.model_dump_json())


def _used_memory(index: Any) -> int:
    return int(index._run(lambda r: r.info("memory"))["used_memory"])


def measure_memory(url: str, metas: list[Any], n: int) -> dict[str, Any]:
    from kcache_server.storage.base import blob_ref
    from kcache_server.storage.redis_index import RedisIndex

    index = RedisIndex(url, prefix="mem")
    try:
        index.ping()
        index.put_if_absent(_kernel_record(-1, metas, time.time()))  # scripts loaded, kinds set made
        claim = _kernel_record(-1, metas, 0)
        index.claim_blob(claim.digest, blob_ref(NS, "kernel", claim.key))
        base = _used_memory(index)
        records = [_kernel_record(i, metas, time.time()) for i in range(n)]
        for r in records:
            index.put_if_absent(r)
        after_records = _used_memory(index)
        for r in records:
            index.claim_blob(r.digest, blob_ref(r.namespace, r.kind, r.key))
        after_refs = _used_memory(index)
        entries = [_entry_record(i) for i in range(n)]
        for e in entries:
            index.put_if_absent(e)
            index.claim_blob(e.digest, blob_ref(e.namespace, e.kind, e.key))
        after_entries = _used_memory(index)
    finally:
        index.close()
    kernel_meta = sum(len(r.meta) for r in records) / n
    entry_meta = sum(len(e.meta) for e in entries) / n
    out = {
        "records": n,
        "kernel_record_bytes": (after_records - base) / n,
        "kernel_ref_bytes": (after_refs - after_records) / n,
        "entry_record_and_ref_bytes": (after_entries - after_refs) / n,
        "kernel_meta_json_bytes": kernel_meta,
        "entry_meta_json_bytes": entry_meta,
    }
    out["kernel_per_1000_kb"] = (out["kernel_record_bytes"] + out["kernel_ref_bytes"]) * 1000 / 1e3
    out["entry_per_1000_kb"] = out["entry_record_and_ref_bytes"] * 1000 / 1e3
    out["kernel_overhead_ratio"] = (out["kernel_record_bytes"] + out["kernel_ref_bytes"]) / kernel_meta
    out["entry_overhead_ratio"] = out["entry_record_and_ref_bytes"] / entry_meta
    return out


def _fill_redis(index: Any, records: list[Any]) -> None:
    """Setup only: the real put script, pipelined 1,000 at a time (the per-record write path
    is what the memory figure above exercises)."""
    from kcache_server.storage.base import blob_ref

    index._remember_kind(NS, "kernel")
    script = index._scripts["put"]
    for i in range(0, len(records), 1000):
        pipe = index._redis().pipeline(transaction=False)
        for r in records[i : i + 1000]:
            script(keys=index._keys(r), args=index._args(r), client=pipe)
        pipe.execute()
    index.backfill_blob_refs([(r.digest, blob_ref(r.namespace, r.kind, r.key)) for r in records])
    index.set_blob_refs_complete()


def _fill_sqlite(index: Any, records: list[Any]) -> None:
    from kcache_server.storage.base import blob_ref
    from kcache_server.storage.sqlite_index import _COLUMNS, _values

    with index._transaction() as conn:
        conn.executemany(f"INSERT INTO records ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", [_values(r) for r in records])
    index.backfill_blob_refs([(r.digest, blob_ref(r.namespace, r.kind, r.key)) for r in records])
    index.set_blob_refs_complete()


def measure_gc(name: str, index: Any, blob_root: Path, metas: list[Any], n: int, repeats: int) -> dict[str, Any]:
    from kcache_schemas import PackLimits
    from kcache_schemas.gc_models import GcRequest
    from kcache_server.storage.file_blobs import FileBlobStore
    from kcache_server.store import CacheStore

    t0 = time.time() - 86400
    records = [_kernel_record(i, metas, t0 + i) for i in range(n)]  # record i used at t0 + i: LRU order
    evict_n = n // 10
    print(f"  {name}: writing {n:,} records and {evict_n:,} blobs ...", flush=True)
    (_fill_redis if name == "redis" else _fill_sqlite)(index, records)
    blobs = FileBlobStore(blob_root)
    for i in range(evict_n):
        digest, data = _blob(i)
        blobs.put(digest, data)
    store = CacheStore(blobs, index, PackLimits(), access_flush_s=60)
    try:
        total = sum(r.size for r in records)
        target = total - sum(r.size for r in records[:evict_n])
        # The read any GC must do: every record's key, size and times (without its JSON).
        listing = common.median([common.timed(lambda: list(store.records.iter_records(NS, "kernel", meta=False))) for _ in range(repeats)])
        listing_full = common.median([common.timed(lambda: list(store.records.iter_records(NS, "kernel"))) for _ in range(repeats)])
        collector = store.gc
        plans = []
        for _ in range(repeats):
            report = collector.run(NS, GcRequest(max_bytes=target, min_age_s=3600, dry_run=True))
            plans.append(report.seconds)
            assert report.planned["budget"].entries == evict_n, report.planned
        plan = common.median(plans)
        # The eviction alone: execute a fresh plan under the lease, timed around the execution.
        from kcache_server.store.gc import LEASE, LEASE_TTL_S, _Lease

        lease = _Lease(index, LEASE, LEASE_TTL_S)
        assert lease.acquire()
        try:
            fresh = collector.plan(NS, GcRequest(max_bytes=target, min_age_s=3600))
            t1 = time.perf_counter()
            report = collector._execute(fresh, lease)
            evict_s = time.perf_counter() - t1
        finally:
            lease.release()
        assert report.evicted["budget"].entries == evict_n and report.blobs_deleted.entries == evict_n, report
        run_s = plan + evict_s
        # Baseline: as many plain deletes, one by one, of other records (a second namespace).
        others = [dataclasses.replace(r, namespace="baseline") for r in records[:evict_n]]
        if name == "redis":
            for r in others[:1]:
                index.put_if_absent(r)
            script = index._scripts["put"]
            for i in range(0, len(others), 1000):
                pipe = index._redis().pipeline(transaction=False)
                for r in others[i : i + 1000]:
                    script(keys=index._keys(r), args=index._args(r), client=pipe)
                pipe.execute()
        else:
            from kcache_server.storage.sqlite_index import _COLUMNS, _values

            with index._transaction() as conn:
                conn.executemany(f"INSERT INTO records ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", [_values(r) for r in others])
        plain = common.timed(lambda: [index.delete("baseline", "kernel", r.key) for r in others])
    finally:
        store.access.close()
    return {
        "records": n, "evicted": evict_n,
        "listing_s": round(listing, 3), "listing_with_meta_s": round(listing_full, 3),
        "plan_s": round(plan, 3), "plan_vs_listing": round(plan / listing, 2),
        "gc_run_s": round(run_s, 3), "evict_s": round(evict_s, 3),
        "evict_s_per_1000": round(1000 * evict_s / evict_n, 3),
        "plain_delete_s": round(plain, 3), "plain_delete_s_per_1000": round(1000 * plain / evict_n, 3),
        "evict_vs_plain_delete": round(evict_s / plain, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--memory-sample", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from kcache_server.storage.redis_index import RedisIndex
    from kcache_server.storage.sqlite_index import SqliteIndex

    print("compiling 4 real kernels for their metadata ...", flush=True)
    metas = _real_metas()
    root = common.tmp_root("retention-")
    shm = common.default_dest_root() / "retention-blobs"
    result: dict[str, Any] = {"machine": common.machine(), "args": vars(args)}
    try:
        with common.redis_server(root / "redis") as redis:
            print(f"memory: {args.memory_sample:,} kernel records + references, {args.memory_sample:,} entries ...", flush=True)
            result["memory"] = mem = measure_memory(redis.url, metas, args.memory_sample)
            redis_index = RedisIndex(redis.url, prefix="gc")
            try:
                result["gc_redis"] = measure_gc("redis", redis_index, shm / "redis", metas, args.entries, args.repeats)
                result["gc_redis"]["redis_used_memory_mb"] = round(_used_memory(redis_index) / 1e6, 1)
            finally:
                redis_index.close()
        sqlite_index = SqliteIndex(str(root / "index.sqlite3"))
        try:
            result["gc_sqlite"] = measure_gc("sqlite", sqlite_index, shm / "sqlite", metas, args.entries, args.repeats)
        finally:
            sqlite_index.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    print(f"\nRedis memory per 1,000 index entries (sample of {mem['records']:,}; used_memory deltas):")
    print(f"  kernel: {mem['kernel_per_1000_kb']:.0f} kB  (record {mem['kernel_record_bytes']:.0f} B + blob reference "
          f"{mem['kernel_ref_bytes']:.0f} B each; metadata JSON {mem['kernel_meta_json_bytes']:.0f} B: "
          f"{mem['kernel_overhead_ratio']:.2f}x of it)")
    print(f"  entry:  {mem['entry_per_1000_kb']:.0f} kB  (record and reference {mem['entry_record_and_ref_bytes']:.0f} B each; "
          f"metadata JSON {mem['entry_meta_json_bytes']:.0f} B: {mem['entry_overhead_ratio']:.2f}x)")
    for name in ("gc_redis", "gc_sqlite"):
        g = result[name]
        print(f"\nGC over {g['records']:,} kernel records, {name[3:]} index ({g['evicted']:,} evicted, least recently used):")
        print(f"  listing every record (baseline)   {g['listing_s']:7.2f} s   (with each record's JSON: {g['listing_with_meta_s']:.2f} s)")
        print(f"  plan (dry run)                    {g['plan_s']:7.2f} s   {g['plan_vs_listing']:.2f}x the listing")
        print(f"  evict {g['evicted']:,} (+ refs, blobs)       {g['evict_s']:7.2f} s   {g['evict_s_per_1000']:.3f} s per 1,000; "
              f"{g['evict_vs_plain_delete']:.2f}x as many plain deletes ({g['plain_delete_s_per_1000']:.3f} s per 1,000)")
        if "redis_used_memory_mb" in g:
            print(f"  Redis used_memory afterwards      {g['redis_used_memory_mb']:7.1f} MB")
    common.write_result("retention", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
