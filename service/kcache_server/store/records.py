"""Listing and usage: the index's records read page by page, and what a namespace holds.

The read-only view every other concern lists through (the GC's scan, workload views, runs,
pins, purges, the dashboard's top kernels): no writes, no blobs.
"""

from __future__ import annotations

from collections.abc import Iterator

from kcache_schemas.gc_models import Amount

from kcache_server.kinds import collapse_usage, is_cache_kind
from kcache_server.storage import Index, IndexRecord
from kcache_server.storage.base import KindUsage

_PAGE = 1000


class Records:
    def __init__(self, index: Index) -> None:
        self._index = index

    def all_records(self, namespace: str, kind: str, limit: int | None = None) -> list[IndexRecord]:
        """Every record of a kind (paged through the index), up to ``limit``."""
        records: list[IndexRecord] = []
        for record in self.iter_records(namespace, kind):
            if limit is not None and len(records) >= limit:
                break
            records.append(record)
        return records

    def iter_records(self, namespace: str, kind: str, meta: bool = True) -> Iterator[IndexRecord]:
        """Every record of a kind, one index page at a time (``meta=False``: without their JSON)."""
        after = ""
        while True:
            page = self._index.list(namespace, kind, after=after, limit=_PAGE, meta=meta)
            if not page:
                return
            yield from page
            after = page[-1].key

    def kinds(self, namespace: str) -> dict[str, KindUsage]:
        """Entries and bytes per record kind (uncollapsed: ``workload/<name>`` each)."""
        return self._index.usage().get(namespace, {})

    def usage(self) -> dict[str, dict[str, KindUsage]]:
        """Entries and bytes per namespace and kind family (see :func:`kcache_server.kinds.family`)."""
        return {ns: collapse_usage(kinds) for ns, kinds in self._index.usage().items()}

    def namespaces(self) -> set[str]:
        """Namespaces that hold anything."""
        return set(self._index.usage())

    def cache_usage(self, namespace: str) -> Amount:
        """Kernels and entries stored in ``namespace`` (what its budget counts), read now."""
        return cache_amount(self.kinds(namespace))

    def cache_bytes(self) -> dict[str, int]:
        """Every namespace's cache bytes, read now (one index call)."""
        return {ns: cache_amount(kinds).bytes for ns, kinds in self._index.usage().items()}


def cache_amount(kinds: dict[str, KindUsage]) -> Amount:
    cache = [u for kind, u in kinds.items() if is_cache_kind(kind)]
    return Amount(entries=sum(u.entries for u in cache), bytes=sum(u.bytes for u in cache))
