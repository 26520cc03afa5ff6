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
from kcache_server.storage import BlobStore, Index
from kcache_server.storage.file_blobs import FileBlobStore
from kcache_server.storage.sqlite_index import SqliteIndex


@contextlib.contextmanager
def _file_blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    yield FileBlobStore(tmp_path / "blobs")


@contextlib.contextmanager
def _sqlite_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    idx = SqliteIndex(str(tmp_path / "index.sqlite3"))
    try:
        yield idx
    finally:
        idx.close()


BLOB_BACKENDS: dict[str, Callable[..., Any]] = {"file": _file_blobs}
INDEX_BACKENDS: dict[str, Callable[..., Any]] = {"sqlite": _sqlite_index}
