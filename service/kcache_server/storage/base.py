"""The storage contract every backend implements, and the errors it may raise.

Two parts, so bytes and metadata can live in the systems built for each (S3 and Redis in
production, a directory and SQLite by default):

* :class:`BlobStore` holds immutable bytes addressed by their sha256 ("digest"). Writing the same
  digest twice is harmless, so concurrent writers never clobber each other.
* :class:`Index` maps ``(namespace, kind, key)`` to a record naming a digest. ``put_if_absent`` is
  the commit point of every write: whoever inserts first wins, later writers see the winner.

Backends translate their SDK's errors at this boundary: "the backend is down or slow" is always
:class:`BackendUnavailable` (the API answers 503), never a raw SDK exception.
"""

from __future__ import annotations

import builtins
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class KindUsage:
    entries: int
    bytes: int


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
    def size(self, digest: str) -> int | None:
        """Stored size in bytes, or ``None`` if absent (used to verify a write)."""

    @abstractmethod
    def delete(self, digest: str) -> None:
        """Remove a blob; absent is not an error."""

    @abstractmethod
    def ping(self) -> None:
        """Raise :class:`BackendUnavailable` unless the store answers."""

    def presigned_get_url(self, digest: str, expires_s: int) -> str | None:
        """A URL a client may GET the blob from directly, if the backend supports it."""
        return None

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
        self, namespace: str, kind: str, *, after: str = "", prefix: str = "", limit: int = 100
    ) -> list[IndexRecord]:
        """Records ordered by key, strictly after ``after``, keys starting with ``prefix``."""

    @abstractmethod
    def touch(self, namespace: str, kind: str, keys: Iterable[str], when: float) -> None:
        """Count a hit and set last access for each key (absent keys are ignored)."""

    @abstractmethod
    def usage(self) -> dict[str, dict[str, KindUsage]]:
        """Entries and bytes per namespace and kind."""

    @abstractmethod
    def ping(self) -> None: ...

    def missing(self, namespace: str, kind: str, keys: builtins.list[str]) -> builtins.list[str]:
        # builtins.list: inside this class ``list`` names the method above
        found = self.get_many(namespace, kind, keys)
        return [k for k in keys if k not in found]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
