"""Shared fixtures: storage backends (every conformance test runs on each), real kernels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from backends import BLOB_BACKENDS, INDEX_BACKENDS
from kcache_server.storage import BlobStore, Index


@pytest.fixture(params=sorted(BLOB_BACKENDS))
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    with BLOB_BACKENDS[request.param](request, tmp_path) as store:
        yield store


@pytest.fixture(params=sorted(INDEX_BACKENDS))
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    with INDEX_BACKENDS[request.param](request, tmp_path) as idx:
        yield idx
