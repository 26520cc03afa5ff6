"""Quarantine: entries torch could not load (or a canary found unsound), out of service for every node.

A marker record (kind ``quarantine/<layer>``, no blob, never evicted) outlives the entry it
names: reads of the key answer 404 ``quarantined``, uploads of it are refused (409) until an
admin lifts it. Layer ``kernel`` names a kernel pack (the key-soundness canary reports those).
Every upload of a kernel or an entry commits through :meth:`Quarantine.commit`, which keeps a
report and a racing upload from both standing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timezone

from kcache_schemas import EntryInfo, QuarantineInfo

from kcache_server.domain_errors import Conflict, NotFound, Quarantined, QuarantinedUpload
from kcache_server.kinds import KERNEL, entry_kind, quarantine_kind
from kcache_server.storage import Index, IndexRecord
from kcache_server.store.blob_references import BlobReferences
from kcache_server.store.commit import CommitProtocol, PutResult

log = logging.getLogger("kcache_server.store")


class Quarantine:
    def __init__(self, index: Index, commits: CommitProtocol, references: BlobReferences) -> None:
        self._index, self._commits, self._references = index, commits, references
        # Bumped whenever this process quarantines or lifts a key: what this process derived from
        # the quarantine set (a cached workload view) is stale from then on.
        self.generation = 0
        self._generation_lock = threading.Lock()

    def commit(self, layer: str, record: IndexRecord, data: bytes, supersede: Callable[[IndexRecord], bool] | None = None) -> PutResult:
        """Commit an upload of ``layer`` unless its key is quarantined (:class:`QuarantinedUpload`)."""
        self._refuse_upload(record.namespace, layer, record.key)
        result = self._commits.commit(record, data, supersede)
        if result.created and self._index.get(record.namespace, quarantine_kind(layer), record.key) is not None:
            # Quarantined while this upload committed: the report writes its marker before it
            # drops the entry, so one of the two sees the other; this one takes its record back.
            self._references.drop(record)
            self._refuse_upload(record.namespace, layer, record.key)
        return result

    def _refuse_upload(self, namespace: str, layer: str, key: str) -> None:
        marker = self._index.get(namespace, quarantine_kind(layer), key)
        if marker is not None:
            raise QuarantinedUpload(f"{layer} entry {key}", QuarantineInfo.model_validate_json(marker.meta).reason)

    def stored(self, namespace: str, kind: str, layer: str, key: str, what: str) -> IndexRecord:
        """The record of ``key``, or the miss a reader gets: :class:`Quarantined` (with the
        reason) for a quarantined key, :class:`NotFound` otherwise. ``what`` names it."""
        record = self._index.get(namespace, kind, key)
        if record is None:
            # Only a miss pays for this lookup: a quarantined key has no record any more.
            marker = self._index.get(namespace, quarantine_kind(layer), key)
            if marker is not None:
                raise Quarantined(what, QuarantineInfo.model_validate_json(marker.meta).reason)
            raise NotFound(what)
        return record

    def report(
        self, namespace: str, layer: str, key: str, reason: str, sha256: str | None = None, reporter: str | None = None,
    ) -> tuple[QuarantineInfo, bool]:
        """Take an entry a client could not load out of service for every node: a marker record
        first, then the entry's record and blob are dropped. ``sha256``: the stored bytes the
        client got; other content under the key (a trusted upload replaced it, or the client's
        local copy was corrupt) is left alone (Conflict). ``(the report in force, whether this
        call made it)``."""
        kind = quarantine_kind(layer)
        existing = self._index.get(namespace, kind, key)
        if existing is not None:
            return QuarantineInfo.model_validate_json(existing.meta), False
        # Layer "kernel" names a kernel pack: its record is the kernel's, its digest the pack's sha256.
        record = self._index.get(namespace, KERNEL if layer == KERNEL else entry_kind(layer), key)
        if record is not None and sha256 is not None and record.digest != sha256:
            raise Conflict(f"{layer} entry {key} is not the content reported (stored sha256 {record.digest[:16]}...): left in service")
        info = QuarantineInfo(
            namespace=namespace, layer=layer, key=key, reason=reason, quarantined_at=datetime.now(timezone.utc),
            reporter=reporter, entry=EntryInfo.model_validate_json(record.meta) if record is not None and layer != KERNEL else None,
        )
        marker = IndexRecord(namespace=namespace, kind=kind, key=key, digest="", size=0, meta=info.model_dump_json())
        stored = self._index.put_if_absent(marker)
        self._changed()
        if record is not None:
            self._references.drop(record)  # record, then its reference, then its blob if nothing else uses it
        log.warning("%s/%s/%s quarantined: %s", namespace, layer, key, reason)
        return QuarantineInfo.model_validate_json(stored.meta), stored.created_at == marker.created_at

    def info(self, namespace: str, layer: str, key: str) -> QuarantineInfo:
        marker = self._index.get(namespace, quarantine_kind(layer), key)
        if marker is None:
            raise NotFound(f"quarantine of {layer} entry {key}")
        return QuarantineInfo.model_validate_json(marker.meta)

    def lift(self, namespace: str, layer: str, key: str) -> None:
        """Let the key be uploaded again (the entry itself stays gone)."""
        if not self._index.delete(namespace, quarantine_kind(layer), key):
            raise NotFound(f"quarantine of {layer} entry {key}")
        self._changed()

    def _changed(self) -> None:
        with self._generation_lock:
            self.generation += 1

    def quarantined_keys(self, namespace: str, layer: str, keys: list[str]) -> set[str]:
        """Which of ``keys`` of ``layer`` are quarantined (one index call)."""
        return set(self._index.get_many(namespace, quarantine_kind(layer), keys)) if keys else set()
