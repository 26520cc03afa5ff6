"""The storage contract every backend implements, and the errors it may raise.

Two parts, so bytes and metadata can live in the systems built for each (S3 and Redis in
production, a directory and SQLite by default):

* :class:`BlobStore` holds immutable bytes addressed by their sha256 ("digest"). Writing the same
  digest twice is harmless, so concurrent writers never clobber each other. A blob is read
  whole (``get``) or streamed (``open``: what the service sends to clients, so N readers of a
  large blob hold a chunk each, not N copies).
* :class:`Index` maps ``(namespace, kind, key)`` to a record naming a digest. ``put_if_absent`` is
  the commit point of every write: whoever inserts first wins, later writers see the winner.

Retention (deleting what the cache no longer needs) adds three things to the index, because
blobs are shared between namespaces and only the index knows who uses them:

* **blob references**: each record with a blob holds a reference ``(digest, ref)`` on it,
  claimed *before* the blob is written and released *after* the record is deleted, so the
  references of a digest are always a superset of the records naming it;
* a **deletion marker** per digest: ``begin_blob_delete`` sets it only while the digest has no
  reference (atomically), and ``claim_blob`` fails while it is set, so a blob is never deleted
  under a writer that is about to commit a record naming it;
* **leases**, so that of several service replicas one GC runs at a time.

Backends translate their SDK's errors at this boundary: "the backend is down or slow" is always
:class:`BackendUnavailable` (the API answers 503), never a raw SDK exception.
"""

from __future__ import annotations

import builtins
import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType


class StorageError(Exception):
    """Base of storage errors."""


class BackendUnavailable(StorageError):
    """The backend cannot be reached or did not answer in time."""

    def __init__(self, backend: str, message: str) -> None:
        super().__init__(f"{backend} is unavailable: {message}")
        self.backend = backend


class BlobNotFound(StorageError):
    """No blob with that digest."""


@dataclass(frozen=True)
class IndexRecord:
    namespace: str
    kind: str  # "kernel", "entry/<layer>", "workload/<name>", "run/<id>"
    key: str
    digest: str  # sha256 of the blob holding the payload ("" for records without a blob)
    size: int  # bytes of that blob
    meta: str  # JSON text of the API-level description (KernelEntry, EntryInfo, ...)
    created_at: float = field(default_factory=time.time)
    last_access: float = 0.0
    hits: int = 0

    @property
    def last_used(self) -> float:
        """When it was last read, or written if never read: what LRU eviction orders by."""
        return max(self.created_at, self.last_access)


@dataclass(frozen=True)
class KindUsage:
    entries: int
    bytes: int


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int
    modified: float  # unix seconds of the last write


def blob_ref(namespace: str, kind: str, key: str) -> str:
    """The reference a record holds on its blob: its id, unambiguous whatever the parts contain."""
    return json.dumps([namespace, kind, key], separators=(",", ":"))


def new_token() -> str:
    """A claim, deletion or lease token: ``<unix time>:<random>``; the time dates stale claims."""
    return f"{time.time():.3f}:{uuid.uuid4().hex[:16]}"


def token_time(token: str) -> float:
    """When a token was made (0 for tokens of another form: treated as old)."""
    try:
        return float(token.split(":", 1)[0])
    except ValueError:
        return 0.0


# What a streamed read hands over at a time: large enough that a 48 MiB pack is a few hundred
# steps, small enough that many concurrent readers hold little each.
READ_CHUNK = 256 << 10


class BlobStream:
    """An open blob, read once: ``size`` bytes in chunks of at most the size asked for. A backend
    failure during the read raises :class:`BackendUnavailable`; ``close`` releases the file or
    connection (also when the reader stops early), and is safe to call twice."""

    def __init__(self, size: int, chunks: Iterator[bytes], close: Callable[[], None] | None = None) -> None:
        self.size = size
        self._chunks = chunks
        self._close = close

    @classmethod
    def of(cls, data: bytes, chunk_size: int = READ_CHUNK) -> BlobStream:
        """A stream over bytes already held."""
        view = memoryview(data)
        return cls(len(data), (bytes(view[i : i + chunk_size]) for i in range(0, len(data), chunk_size)))

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def read(self) -> bytes:
        """The rest of the blob, joined (for small blobs)."""
        return b"".join(self._chunks)

    def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            stop = getattr(self._chunks, "close", None)  # a generator: run its cleanup now
            if stop is not None:
                stop()
            close()

    def __enter__(self) -> BlobStream:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class BlobStore(ABC):
    """Immutable bytes by sha256 digest."""

    name: str = "blobs"

    @abstractmethod
    def put(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest`` atomically: readers see all of it or nothing."""

    @abstractmethod
    def get(self, digest: str) -> bytes:
        """Return the bytes; :class:`BlobNotFound` if absent."""

    @abstractmethod
    def open(self, digest: str, chunk_size: int = READ_CHUNK) -> BlobStream:
        """Open the blob for a streamed read: :class:`BlobNotFound` now if absent (never halfway
        through), then the bytes as they are read, never more than ``chunk_size`` held at once.
        The caller closes the stream. A blob deleted while it is read (a GC) is read whole from
        a file store (the open file stays); another backend may end the read with
        :class:`BackendUnavailable`, never with other bytes."""

    @abstractmethod
    def size(self, digest: str) -> int | None:
        """Stored size in bytes, or ``None`` if absent (used to verify a write)."""

    @abstractmethod
    def delete(self, digest: str) -> None:
        """Remove a blob; absent is not an error."""

    @abstractmethod
    def ping(self) -> None:
        """Raise :class:`BackendUnavailable` unless the store answers."""

    @abstractmethod
    def scan(self) -> Iterator[BlobInfo]:
        """Every stored blob, in no particular order (the orphan sweep compares them with the
        index). Partial writes (temp files, unfinished uploads) are not blobs."""

    # Whether :meth:`presigned_get_url` makes URLs: the service then tells prefetching clients to
    # ask for URLs rather than bytes (wire.DOWNLOADS), when presigned downloads are on.
    presigns: bool = False

    def presigned_get_url(self, digest: str, expires_s: int) -> str | None:
        """A URL a client may GET the blob from directly, if the backend supports it."""
        return None

    def delete_many(self, digests: Sequence[str]) -> builtins.list[str]:
        """Delete blobs (absent is not an error); the digests that are gone now. Backends with a
        bulk delete (S3's DeleteObjects) override this."""
        for digest in digests:
            self.delete(digest)
        return builtins.list(digests)

    def remove_partial(self, older_than: float) -> int:
        """Remove leftovers of interrupted writes older than ``older_than`` (unix seconds); how
        many. Backends whose writes leave none (S3: an unfinished upload is a lifecycle rule's
        job) keep this default."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class Index(ABC):
    """Records by ``(namespace, kind, key)``."""

    name: str = "index"

    @abstractmethod
    def get(self, namespace: str, kind: str, key: str) -> IndexRecord | None: ...

    @abstractmethod
    def get_many(self, namespace: str, kind: str, keys: list[str]) -> dict[str, IndexRecord]: ...

    @abstractmethod
    def put_if_absent(self, record: IndexRecord) -> IndexRecord:
        """Insert unless a record with the same id exists; return the record now stored."""

    @abstractmethod
    def upsert(self, record: IndexRecord) -> None:
        """Insert or overwrite (for mutable kinds such as run statistics)."""

    @abstractmethod
    def delete(self, namespace: str, kind: str, key: str, digest: str | None = None) -> bool:
        """Delete a record; with ``digest``, only if it still names that digest."""

    @abstractmethod
    def list(
        self, namespace: str, kind: str, *, after: str = "", prefix: str = "", limit: int = 100, meta: bool = True
    ) -> list[IndexRecord]:
        """Records ordered by key, strictly after ``after``, keys starting with ``prefix``; with
        ``meta=False`` their ``meta`` is ``""`` (a GC scan needs only sizes and times)."""

    @abstractmethod
    def touch(self, namespace: str, kind: str, keys: Iterable[str], when: float) -> None:
        """Count a hit and set last access for each key (absent keys are ignored)."""

    @abstractmethod
    def usage(self) -> dict[str, dict[str, KindUsage]]:
        """Entries and bytes per namespace and kind."""

    @abstractmethod
    def ping(self) -> None: ...

    # ---- retention -------------------------------------------------------------------------

    @abstractmethod
    def delete_unused(self, records: Sequence[IndexRecord]) -> builtins.list[bool]:
        """Evict: delete each record only if it still names the same digest and was not used
        after the ``last_used`` it was read with (a hit flushed since, or a re-upload, keeps it).
        Atomic per record; which ones were deleted, in order."""

    @abstractmethod
    def claim_blob(self, digest: str, ref: str) -> str | None:
        """Add reference ``ref`` to ``digest`` (replacing an earlier claim of the same ref) and
        return its token; ``None`` while a deletion of ``digest`` is in progress (retry later)."""

    @abstractmethod
    def release_blob(self, digest: str, ref: str, token: str) -> bool:
        """Remove reference ``ref`` from ``digest`` if it still holds ``token`` (a newer claim of
        the same ref, e.g. a re-upload after an eviction, is kept)."""

    @abstractmethod
    def blob_refs(self, digests: Sequence[str]) -> dict[str, dict[str, str]]:
        """``{digest: {ref: token}}`` for the digests that have references."""

    @abstractmethod
    def backfill_blob_refs(self, refs: Sequence[tuple[str, str]]) -> int:
        """Add ``(digest, ref)`` references that are missing (records written before references
        existed), leaving existing claims alone; how many were added."""

    @abstractmethod
    def blob_refs_complete(self) -> bool:
        """Whether every record's reference is known to exist (set once, after a backfill)."""

    @abstractmethod
    def set_blob_refs_complete(self) -> None: ...

    @abstractmethod
    def begin_blob_delete(self, digest: str, token: str, ttl_s: float) -> bool:
        """Atomically: if ``digest`` has no reference and no deletion in progress, mark it as
        being deleted (for at most ``ttl_s``) and return True."""

    @abstractmethod
    def end_blob_delete(self, digest: str, token: str) -> None:
        """Clear the deletion marker if it is still ours."""

    # Batched forms, one round trip per batch where the backend allows; same semantics per item.

    def release_blobs(self, releases: Sequence[tuple[str, str, str]]) -> builtins.list[bool]:
        """:meth:`release_blob` for each ``(digest, ref, token)``."""
        return [self.release_blob(d, ref, token) for d, ref, token in releases]

    def begin_blob_deletes(self, digests: Sequence[str], token: str, ttl_s: float) -> builtins.list[bool]:
        """:meth:`begin_blob_delete` for each digest, with one token."""
        return [self.begin_blob_delete(d, token, ttl_s) for d in digests]

    def end_blob_deletes(self, digests: Sequence[str], token: str) -> None:
        for d in digests:
            self.end_blob_delete(d, token)

    @abstractmethod
    def acquire_lease(self, name: str, token: str, ttl_s: float) -> bool:
        """Take lease ``name`` for ``ttl_s`` seconds, or extend it if ``token`` holds it; False
        while another token holds it."""

    @abstractmethod
    def release_lease(self, name: str, token: str) -> None:
        """Give lease ``name`` back if ``token`` holds it."""

    def missing(self, namespace: str, kind: str, keys: builtins.list[str]) -> builtins.list[str]:
        # builtins.list: inside this class ``list`` names the method above
        found = self.get_many(namespace, kind, keys)
        return [k for k in keys if k not in found]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
