"""Purge by recorded key part (``POST /v1/{namespace}/purge``, admin): see
:mod:`kcache_schemas.purge` for the conditions.

Scan → plan → (unless a dry run) delete, like the GC: the namespace's ``key-components`` entries
are read one at a time (each a small JSON document, at most ``max_scan`` of them), every recorded
key whose parts match all conditions names its cached entry (FX-graph entries are stored under
Inductor's remote form of the key, ``pt2:fx-graph-v1::<key>:c1``, matched by the key inside) or
kernel, and those are deleted (index record first, then the blob if nothing else uses it), with
the recorded parts. Identity markers (``<layer>.i.<identity>.<key>``) are not recorded keys.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

from kcache_schemas import signed_envelope as envelope
from kcache_schemas import wire
from kcache_schemas.key_diff import IDENTITY_MARK, KeyComponents, graph_key
from kcache_schemas.models import EntryInfo
from kcache_schemas.purge import (
    ENVIRONMENT_FIELDS,
    MAX_ITEMS,
    PRODUCER_KEY,
    RUN,
    PurgeItem,
    PurgeReport,
    PurgeRequest,
    parse_condition,
)
from pydantic import ValidationError

from kcache_server.domain_errors import NotFound
from kcache_server.kinds import KERNEL, entry_kind
from kcache_server.storage import BlobNotFound, BlobStore, Index, IndexRecord
from kcache_server.store.cache_entries import CacheEntries
from kcache_server.store.kernel_packs import KernelPacks
from kcache_server.store.records import Records

COMPONENTS = wire.CacheLayer.KEY_COMPONENTS.value


class KeyPartPurge:
    def __init__(self, blobs: BlobStore, index: Index, records: Records, kernels: KernelPacks, entries: CacheEntries) -> None:
        self._blobs, self._index, self._records, self._kernels, self._entries = blobs, index, records, kernels, entries

    def run(self, namespace: str, request: PurgeRequest) -> PurgeReport:
        started = time.monotonic()
        conditions = [parse_condition(text) for text in request.where]
        by_graph: dict[str, dict[str, list[IndexRecord]]] = {}
        scanned = matched = deleted = nbytes = 0
        items: list[PurgeItem] = []
        for found in self._recorded(namespace, request.max_scan):
            scanned += 1
            if found is None:
                continue
            components_record, parts = found
            for record in self._stored(namespace, parts, by_graph):
                if not _facts_match(conditions, parts, _entry_info(record)):
                    continue
                matched += 1
                nbytes += record.size
                if len(items) < MAX_ITEMS:
                    items.append(PurgeItem(layer=parts.layer, key=record.key, size=record.size))
                if not request.dry_run:
                    try:
                        if record.kind == KERNEL:
                            self._kernels.delete(namespace, record.key)
                        else:
                            self._entries.delete(namespace, parts.layer, record.key)
                        deleted += 1
                    except NotFound:
                        pass  # evicted or deleted meanwhile
                    with contextlib.suppress(NotFound):  # another match of the same record took it
                        self._entries.delete(namespace, COMPONENTS, components_record.key)
        return PurgeReport(
            namespace=namespace, where=request.where, dry_run=request.dry_run, scanned=scanned,
            truncated=scanned >= request.max_scan, matched=matched, deleted=deleted, bytes=nbytes, items=items,
            seconds=round(time.monotonic() - started, 3),
        )

    def _recorded(self, namespace: str, limit: int) -> Iterator[tuple[IndexRecord, KeyComponents] | None]:
        """Each recorded key's parts (None for one that cannot be read: counted, not matched)."""
        seen = 0
        for record in self._records.iter_records(namespace, entry_kind(COMPONENTS), meta=False):
            if IDENTITY_MARK in record.key:
                continue
            if seen >= limit:
                return
            seen += 1
            try:
                data = self._blobs.get(record.digest)
                payload = envelope.parse(data).payload() if envelope.is_signed(data) else data
                yield record, KeyComponents.model_validate_json(payload)
            except (BlobNotFound, ValidationError, ValueError):  # SignatureError is a ValueError
                yield None

    def _stored(self, namespace: str, parts: KeyComponents, by_graph: dict[str, dict[str, list[IndexRecord]]]) -> list[IndexRecord]:
        """The cached records a recorded key names: the kernel, or the layer's entries under it."""
        if parts.layer == KERNEL:
            found = self._index.get(namespace, KERNEL, parts.key)
            return [found] if found is not None else []
        if parts.layer not in by_graph:
            index: dict[str, list[IndexRecord]] = {}
            for r in self._records.iter_records(namespace, entry_kind(parts.layer)):
                index.setdefault(graph_key(r.key), []).append(r)
            by_graph[parts.layer] = index
        return by_graph[parts.layer].get(graph_key(parts.key), [])


def _facts_match(conditions: list[tuple[str, str]], parts: KeyComponents, info: EntryInfo | None) -> bool:
    for name, value in conditions:
        if name in ENVIRONMENT_FIELDS:
            actual = getattr(parts.environment, name, None) if parts.environment is not None else None
        elif name == RUN:
            actual = parts.run_id
            if actual is None and info is not None and info.signature is not None:
                actual = info.signature.provenance.run_id
        elif name == PRODUCER_KEY:
            actual = info.signature.key_id if info is not None and info.signature is not None else None
        else:
            part = parts.components.get(name) or parts.context.get(name)
            actual = part.value if part is not None else None
        if actual is None or actual != value:
            return False
    return True


def _entry_info(record: IndexRecord) -> EntryInfo | None:
    if record.kind == KERNEL:
        return None
    try:
        return EntryInfo.model_validate_json(record.meta)
    except (ValidationError, json.JSONDecodeError):
        return None
