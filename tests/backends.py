"""Factories for every storage backend the conformance suite runs on.

Each factory is a context manager ``(request, tmp_path) -> backend`` giving a fresh, empty
backend. Backends that need servers (S3 via SeaweedFS, Redis, Redis Cluster) start or reach real
ones on loopback; see servers.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import servers
from kcache_server.storage import BlobStore, Index
from kcache_server.storage.file_blobs import FileBlobStore
from kcache_server.storage.sqlite_index import SqliteIndex


@contextlib.contextmanager
def _file_blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    yield FileBlobStore(tmp_path / "blobs")


@contextlib.contextmanager
def _s3_blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    # SeaweedFS (session-wide), a fresh object prefix per test.
    with servers.s3_view(request, tmp_path) as store:
        yield store


@contextlib.contextmanager
def _sqlite_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    idx = SqliteIndex(str(tmp_path / "index.sqlite3"))
    try:
        yield idx
    finally:
        idx.close()


@contextlib.contextmanager
def _redis_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    # The shared Redis on 127.0.0.1:6379, a fresh key prefix per test.
    with servers.redis_view(servers.shared_redis_url(request.config)) as idx:
        yield idx


@contextlib.contextmanager
def _redis_cluster_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    # A 3-master Redis Cluster (session-wide), a fresh key prefix per test.
    with servers.redis_view(servers.redis_cluster(request.config).url) as idx:
        yield idx


BLOB_BACKENDS: dict[str, Callable[..., Any]] = {"file": _file_blobs, "s3": _s3_blobs}
INDEX_BACKENDS: dict[str, Callable[..., Any]] = {
    "sqlite": _sqlite_index,
    "redis": _redis_index,
    "redis-cluster": _redis_cluster_index,
}
