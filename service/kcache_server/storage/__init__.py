"""Storage behind one contract: a content-addressed blob store and an index of records."""

from kcache_server.storage.base import (
    BackendUnavailable,
    BlobNotFound,
    BlobStore,
    BlobStream,
    Index,
    IndexRecord,
    StorageError,
)
from kcache_server.storage.registry import open_blob_store, open_index

__all__ = [
    "BackendUnavailable",
    "BlobNotFound",
    "BlobStore",
    "BlobStream",
    "Index",
    "IndexRecord",
    "StorageError",
    "open_blob_store",
    "open_index",
]
