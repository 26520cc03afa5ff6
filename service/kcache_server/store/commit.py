"""The commit protocol: write blob → verify → index entry, and reads that repair a lost blob.

Every write: check the namespace's hard storage limit → claim a reference on the blob → write
the blob (content-addressed) → check the blob is there with the right size → insert the index
record (the commit point; first writer wins) → check the blob once more. Entries are write-once:
a second write with the same content is accepted, different content is a conflict. A record
whose blob has vanished is a miss and is removed (the cache repairs itself). Deletes mirror it
(:mod:`.blob_references`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from kcache_server.domain_errors import Conflict, NotFound
from kcache_server.kinds import KERNEL
from kcache_server.storage import (
    BackendUnavailable,
    BlobNotFound,
    BlobStore,
    BlobStream,
    Index,
    IndexRecord,
)
from kcache_server.storage.base import blob_ref
from kcache_server.store.blob_references import BlobReferences
from kcache_server.store.storage_limits import StorageLimits

log = logging.getLogger("kcache_server.store")


@dataclass(frozen=True)
class PutResult:
    created: bool
    meta: str  # JSON of the stored entry


class CommitProtocol:
    def __init__(self, blobs: BlobStore, index: Index, references: BlobReferences, limits: StorageLimits) -> None:
        self._blobs, self._index, self._references, self._limits = blobs, index, references, limits

    def commit(self, record: IndexRecord, data: bytes, supersede: Callable[[IndexRecord], bool] | None = None) -> PutResult:
        """``supersede(existing)``: whether a stored record with other content gives way to this
        one (write-once otherwise; see :func:`kcache_server.producer_keys.supersedes`)."""
        existing = self._index.get(record.namespace, record.kind, record.key)
        if existing is not None and supersede is not None and _content_id(existing) != _content_id(record) and supersede(existing):
            log.info("%s/%s/%s: the stored entry gives way to a trusted upload", record.namespace, record.kind, record.key)
            self._references.drop(existing)  # record, then its reference, then its blob if nothing else uses it
            existing = None
        if existing is not None:
            return _resolve_existing(existing, record)
        self._limits.check(record.namespace, len(data))
        ref = blob_ref(record.namespace, record.kind, record.key)
        # The claim comes first: from here on no GC starts deleting this blob, and one already
        # deleting it has finished (claim waits), so the blob written below stays.
        token = self._references.claim(record.digest, ref)
        self._write_blob(record.digest, data)
        # A failure from here on keeps the claim: the record may have committed (a frozen Redis
        # that resumes runs the queued insert); a claim without its record is a leak the orphan
        # sweep reclaims, a record without its claim could lose its blob.
        stored = self._index.put_if_absent(record)
        if stored.digest != record.digest:
            # Lost the race to a writer of other content: our reference and blob are not needed.
            self._references.release(record.digest, ref, token)
            return _resolve_existing(stored, record)
        # Verified before the insert; once more now that the record commits it. Only a GC whose
        # deletion marker expired while it stalled (begun before our claim) can have deleted it,
        # and our claim stops every later one, so writing it back is final.
        if self._blobs.size(record.digest) != len(data):
            log.warning("blob %s vanished while its record committed; writing it again", record.digest)
            self._write_blob(record.digest, data)
        created = stored.created_at == record.created_at
        if created:
            self._limits.count(record.namespace, record.size)
        return PutResult(created=created, meta=stored.meta)

    def _write_blob(self, digest: str, data: bytes) -> None:
        self._blobs.put(digest, data)
        if self._blobs.size(digest) != len(data):
            raise BackendUnavailable(self._blobs.name, "blob did not verify after write")

    # ---- reads that repair -------------------------------------------------------------------

    def read(self, record: IndexRecord) -> bytes:
        """The record's blob, whole; a blob that is gone is a miss (:class:`NotFound`) and its
        record is removed."""
        try:
            return self._blobs.get(record.digest)
        except BlobNotFound:
            pass
        # Evicted between our index read and blob read (a miss), or the bytes are gone (a pruned
        # bucket, a lost disk): drop the record if it still names them, so the next writer can
        # repopulate it, and report a miss. A writer that put the same bytes back meanwhile wins.
        if self._blobs.size(record.digest) is not None:
            with contextlib.suppress(BlobNotFound):
                return self._blobs.get(record.digest)
        self._lost(record)

    def open(self, record: IndexRecord) -> BlobStream:
        """:meth:`read`, streamed: what responses send, so that concurrent readers of a large
        blob hold a chunk each instead of a copy each."""
        try:
            return self._blobs.open(record.digest)
        except BlobNotFound:
            pass
        if self._blobs.size(record.digest) is not None:
            with contextlib.suppress(BlobNotFound):
                return self._blobs.open(record.digest)
        self._lost(record)

    def _lost(self, record: IndexRecord) -> NoReturn:
        if self._references.drop(record):
            log.warning("blob %s for %s/%s vanished; removed its index record", record.digest, record.kind, record.key)
        raise NotFound(f"{record.kind} {record.key}") from None


def _resolve_existing(existing: IndexRecord, new: IndexRecord) -> PutResult:
    if _content_id(existing) == _content_id(new):
        return PutResult(created=False, meta=existing.meta)
    raise Conflict(
        f"{new.key} already exists in namespace {new.namespace!r} with different content; "
        "entries are write-once"
    )


def _content_id(record: IndexRecord) -> str:
    """What makes two writes "the same": kernel file hashes, or the raw bytes for entries."""
    if record.kind == KERNEL:
        return str(json.loads(record.meta)["content_digest"])
    return record.digest
