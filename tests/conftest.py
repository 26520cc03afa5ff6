"""Shared fixtures: storage backends (every conformance test runs on each), real kernels."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # for bench.corpus (real Triton kernel generator)
sys.path.insert(0, str(REPO / "tests"))

from backends import BLOB_BACKENDS, INDEX_BACKENDS  # noqa: E402
from kcache_server.storage import BlobStore, Index  # noqa: E402


@pytest.fixture(params=sorted(BLOB_BACKENDS))
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    with BLOB_BACKENDS[request.param](request, tmp_path) as store:
        yield store


@pytest.fixture(params=sorted(INDEX_BACKENDS))
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    with INDEX_BACKENDS[request.param](request, tmp_path) as idx:
        yield idx
