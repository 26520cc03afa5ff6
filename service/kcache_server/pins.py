"""Pins: a pinned workload's kernels and entries are never evicted (``/v1/{namespace}/pins``).

A pin is an index record (kind ``pin``, key the workload name); what it protects is read when the
GC runs: every kernel and entry that any published run of the workload lists, in every
environment. A workload may be pinned before its first run is published.
"""

from __future__ import annotations

from datetime import datetime, timezone

from kcache_schemas.retention import Pin, PinList

from kcache_server.errors import NotFound
from kcache_server.kinds import PIN
from kcache_server.storage import IndexRecord
from kcache_server.store import CacheStore


def pin(store: CacheStore, namespace: str, workload: str) -> tuple[Pin, bool]:
    """Pin ``workload``; ``(the pin, whether it is new)``."""
    new = Pin(workload=workload, pinned_at=datetime.now(timezone.utc))
    record = IndexRecord(namespace=namespace, kind=PIN, key=workload, digest="", size=0, meta=new.model_dump_json())
    stored = store.index.put_if_absent(record)
    return Pin.model_validate_json(stored.meta), stored.created_at == record.created_at


def unpin(store: CacheStore, namespace: str, workload: str) -> None:
    if not store.index.delete(namespace, PIN, workload):
        raise NotFound(f"pin of workload {workload}")


def pins(store: CacheStore, namespace: str) -> PinList:
    return PinList(items=[Pin.model_validate_json(r.meta) for r in store.all_records(namespace, PIN)])
