"""Shared fixtures: storage backends (every conformance test runs on each), real kernels; the
order modules are handed to the workers in."""

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


def _weight(item: pytest.Item) -> int:
    """Heavier first: the host-safety scenarios (hundreds of interpreters), then modules that drive
    torch in subprocesses, then other end-to-end modules, then the fast ones."""
    marks = {m.name for m in item.iter_markers()}
    return -(4 * ("host_safety" in marks) + 2 * bool(marks & {"torch", "one_torch"}) + ("slow" in marks))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules in order of weight (their heaviest test), each module's tests in file order: with
    ``--dist loadscope`` the longest modules start first, so no worker is left with one at the end."""
    module_weight: dict[str, int] = {}
    for item in items:
        module_weight[item.module.__name__ if item.module else ""] = min(
            module_weight.get(item.module.__name__ if item.module else "", 0), _weight(item)
        )
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (module_weight[it.module.__name__ if it.module else ""], position[id(it)]))
