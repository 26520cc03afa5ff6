"""Backends chosen by URL, imported lazily so optional SDKs are needed only when used.

``file:///path`` and ``sqlite:///path`` ship with the service; ``s3://`` needs boto3 and
``redis://``/``rediss://``/``redis+cluster://`` need redis-py: a missing SDK is a clear error
naming the package to install (the fsspec registry habit).
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import unquote, urlsplit

from kcache_server.storage.base import BlobStore, Index

# scheme -> (module, class, the SDK to pip install: kcache-server's [s3] / [redis] extras carry it)
_BLOB_BACKENDS = {
    "file": ("kcache_server.storage.file_blobs", "FileBlobStore", None),
    "s3": ("kcache_server.storage.s3_blobs", "S3BlobStore", "boto3"),
}
_INDEX_BACKENDS = {
    "sqlite": ("kcache_server.storage.sqlite_index", "SqliteIndex", None),
    "redis": ("kcache_server.storage.redis_index", "RedisIndex", "redis"),
    "rediss": ("kcache_server.storage.redis_index", "RedisIndex", "redis"),
    "redis+cluster": ("kcache_server.storage.redis_index", "RedisIndex", "redis"),
}


class BackendConfigError(ValueError):
    """A storage URL names an unknown scheme or a backend whose SDK is not installed."""


def _load(table: dict[str, tuple[str, str, str | None]], url: str, what: str) -> type[Any]:
    scheme = urlsplit(url).scheme
    if scheme not in table:
        raise BackendConfigError(f"unknown {what} URL scheme {scheme!r} in {url!r}; use one of {sorted(table)}")
    module, cls, sdk = table[scheme]
    try:
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]
    except ImportError as exc:
        hint = f"; install it with: pip install {sdk}" if sdk else ""
        raise BackendConfigError(f"{what} backend {scheme!r} needs {exc.name}{hint}") from exc


def _local_path(url: str) -> str:
    parts = urlsplit(url)
    return unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)


def open_blob_store(url: str, **options: Any) -> BlobStore:
    cls = _load(_BLOB_BACKENDS, url, "blob store")
    if urlsplit(url).scheme == "file":
        return cls(_local_path(url))  # type: ignore[no-any-return]
    return cls(url, **options)  # type: ignore[no-any-return]


def open_index(url: str, **options: Any) -> Index:
    cls = _load(_INDEX_BACKENDS, url, "index")
    if urlsplit(url).scheme == "sqlite":
        return cls(_local_path(url))  # type: ignore[no-any-return]
    return cls(url, **options)  # type: ignore[no-any-return]
