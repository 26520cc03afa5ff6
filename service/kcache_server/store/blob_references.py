"""Retention references: which records hold a blob, and deleting a blob only when none does.

Blobs are content-addressed and shared between namespaces, so a record names its blob through a
reference (``blob_ref(namespace, kind, key)``) in the index. Every delete (eviction, an admin's
delete, a read's repair, a lost race) mirrors the commit protocol (:mod:`.commit`): the index
record first, then its reference, then the blob, only if no reference is left and only under
the index's deletion marker, which a writer's claim waits for. So no reader ever meets a record
whose blob was deleted on purpose, and no writer commits a record whose blob a GC is deleting
(see :mod:`kcache_server.storage.base`, docs/storage.md "Retention").

References are trusted for deletes only once they are complete: an index written before
references existed is backfilled by the GC first (:meth:`BlobReferences.backfill`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kcache_schemas.gc_models import Amount

from kcache_server.storage import BackendUnavailable, BlobStore, Index, IndexRecord
from kcache_server.storage.base import blob_ref, new_token
from kcache_server.store.records import Records
from kcache_server.store.storage_limits import StorageLimits

# A blob deletion marker outlives a stalled GC by this much; a writer of that blob waits for it at
# most _CLAIM_WAIT_S (a live GC holds it for one delete call), then answers 503.
BLOB_DELETE_TTL_S = 60.0
_CLAIM_WAIT_S = 10.0


@dataclass
class EvictResult:
    """What :meth:`BlobReferences.evict` did: per record whether it was deleted, and the blobs."""

    deleted: list[bool]
    blobs_deleted: Amount = field(default_factory=Amount)
    blobs_shared: int = 0  # blobs kept because another record still references them


class BlobReferences:
    def __init__(self, blobs: BlobStore, index: Index, records: Records, limits: StorageLimits) -> None:
        self._blobs, self._index, self._records, self._limits = blobs, index, records, limits
        self._complete = False
        self._checked = False

    # ---- a writer's side --------------------------------------------------------------------

    def claim(self, digest: str, ref: str) -> str:
        """Claim a reference on the blob before writing it: from then on no GC starts deleting
        it, and one already deleting it has finished (we wait for it). The claim's token."""
        if not self._checked:  # once per process: a fresh index is complete from its first write
            self._checked = True
            self.refs_complete()
        deadline = time.monotonic() + _CLAIM_WAIT_S
        pause = 0.01
        while True:
            token = self._index.claim_blob(digest, ref)
            if token is not None:
                return token
            if time.monotonic() + pause > deadline:
                raise BackendUnavailable(self._index.name, f"blob {digest[:16]}… is being deleted by a GC that does not finish; retry")
            time.sleep(pause)  # a GC is deleting this very blob right now: one delete call
            pause = min(pause * 2, 0.2)

    def release(self, digest: str, ref: str, token: str) -> None:
        """Give a claim back (a writer that lost the race), and the blob if nobody else holds it."""
        self._index.release_blob(digest, ref, token)
        self.delete_blob_if_unreferenced(digest)

    # ---- deletes ----------------------------------------------------------------------------

    def drop(self, record: IndexRecord) -> bool:
        """Delete one record if it still names its digest, then its reference and blob."""
        ref = blob_ref(record.namespace, record.kind, record.key)
        token = self._index.blob_refs([record.digest]).get(record.digest, {}).get(ref) if record.digest else None
        if not self._index.delete(record.namespace, record.kind, record.key, digest=record.digest):
            return False
        if token is not None:
            self.release(record.digest, ref, token)
        return True

    def evict(self, records: list[IndexRecord]) -> EvictResult:
        """Delete records that were not used since they were read (index entries first), then the
        blobs no record references any more. Records used or replaced meanwhile are kept."""
        with_blob = [r for r in records if r.digest]
        tokens = self._index.blob_refs([r.digest for r in with_blob]) if with_blob else {}
        result = EvictResult(deleted=self._index.delete_unused(records))
        released: dict[str, int] = {}
        releases: list[tuple[str, str, str]] = []
        for r, ok in zip(records, result.deleted, strict=True):
            if not ok or not r.digest:
                continue
            ref = blob_ref(r.namespace, r.kind, r.key)
            token = tokens.get(r.digest, {}).get(ref)
            if token is not None:
                releases.append((r.digest, ref, token))
            released[r.digest] = r.size
        self._index.release_blobs(releases)
        deleted = set(self.delete_blobs_if_unreferenced(list(released)))
        for digest, size in released.items():
            if digest in deleted:
                result.blobs_deleted = result.blobs_deleted.plus(size)
            else:
                result.blobs_shared += 1
        self._limits.forget()  # budgets see the space at once
        return result

    def delete_blob_if_unreferenced(self, digest: str) -> bool:
        return bool(self.delete_blobs_if_unreferenced([digest]))

    def delete_blobs_if_unreferenced(self, digests: list[str]) -> list[str]:
        """Delete blobs under the index's deletion markers, which are only set while no record
        (of any namespace) references the blob and which make writers of the same bytes wait;
        the digests deleted."""
        if not digests or not self.refs_complete():
            return []  # the GC backfills references first; until then nothing is deleted
        token = new_token()
        began = time.monotonic()
        marked = [d for d, ok in zip(digests, self._index.begin_blob_deletes(digests, token, BLOB_DELETE_TTL_S), strict=True) if ok]
        if not marked:
            return []
        try:
            if time.monotonic() - began > BLOB_DELETE_TTL_S / 2:
                return []  # a slow answer: the markers may expire under us; leave them for later
            return self._blobs.delete_many(marked)
        finally:
            self._index.end_blob_deletes(marked, token)

    # ---- completeness -------------------------------------------------------------------------

    def refs_complete(self) -> bool:
        """Whether blob references can be trusted to name every record's blob: set once the GC
        backfilled them, or at once for an index that holds nothing yet."""
        if not self._complete:
            if not self._index.blob_refs_complete() and not self._index.usage():
                self._index.set_blob_refs_complete()
            self._complete = self._index.blob_refs_complete()
        return self._complete

    def backfill(self) -> int:
        """Add a reference for every record with a blob (all namespaces) where one is missing:
        records written before references existed, or during a rolling upgrade by a replica
        without them. Marks references complete; how many were added."""
        added = 0
        for namespace, kinds in self._index.usage().items():
            for kind in kinds:
                batch = [(r.digest, blob_ref(r.namespace, r.kind, r.key)) for r in self._records.iter_records(namespace, kind, meta=False) if r.digest]
                added += self._index.backfill_blob_refs(batch) if batch else 0
        self._index.set_blob_refs_complete()
        self._complete = True
        return added
