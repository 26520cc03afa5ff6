"""Pins: a pinned workload's kernels and entries are never evicted (``/v1/{namespace}/pins``).

A pin is an index record (kind ``pin``, key the workload name); what it protects is read when the
GC runs: every kernel and entry that any published run of the workload lists, in every
environment. A workload no published run names is refused (404: a typo must not pass as a pin),
unless the pin is asked for ahead of the workload's first run (``?ahead=true``).
"""

from __future__ import annotations

from datetime import datetime, timezone

from kcache_schemas import wire
from kcache_schemas.gc_models import Pin, PinList

from kcache_server.domain_errors import NotFound
from kcache_server.kinds import PIN, workload_kind
from kcache_server.storage import Index, IndexRecord
from kcache_server.store.records import Records


class Pins:
    def __init__(self, index: Index, records: Records) -> None:
        self._index, self._records = index, records

    def pin(self, namespace: str, workload: str, ahead: bool = False) -> tuple[Pin, bool]:
        """Pin ``workload``; ``(the pin, whether it is new)``. Unless ``ahead``, the workload must have
        a published run in the namespace."""
        if not ahead and not self._records.all_records(namespace, workload_kind(workload), limit=1):
            raise NotFound(f"workload {workload!r} in namespace {namespace!r} (no run of it is published; "
                           f"pin it ahead of its first run with ?{wire.PIN_AHEAD}=true)")
        new = Pin(workload=workload, pinned_at=datetime.now(timezone.utc))
        record = IndexRecord(namespace=namespace, kind=PIN, key=workload, digest="", size=0, meta=new.model_dump_json())
        stored = self._index.put_if_absent(record)
        return Pin.model_validate_json(stored.meta), stored.created_at == record.created_at

    def unpin(self, namespace: str, workload: str) -> None:
        if not self._index.delete(namespace, PIN, workload):
            raise NotFound(f"pin of workload {workload}")

    def listing(self, namespace: str) -> PinList:
        return PinList(items=[Pin.model_validate_json(r.meta) for r in self._records.all_records(namespace, PIN)])
