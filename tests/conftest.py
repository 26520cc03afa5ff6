"""Shared fixtures: storage backends (every conformance test runs on each), real kernels; the
order modules are handed to the workers in."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends import BLOB_BACKENDS, INDEX_BACKENDS
from kcache.host.launchers import LAUNCHER_VARIABLES
from kcache_server.storage import BlobStore, Index

from kcache_testkit import compiler_cache


def pytest_configure(config: pytest.Config) -> None:
    """A suite run inside a CI job, a SLURM allocation or a Kubernetes pod: without this, every
    job a test starts would report its stats to a run named after that CI job (kcache.host.launchers)
    and every test that lists runs would see them. Tests that want a launcher set its variables."""
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    _use_compiler_cache(config)


def _use_compiler_cache(config: pytest.Config) -> None:
    """Job interpreters find the test compiler cache first on ``PATH`` (kcache_testkit.compiler_cache:
    each fresh node's Inductor C++ builds are the same few sources; ~13 s of g++ a node). One
    wrapper dir per Python, so the main suite and the torch matrix's venvs never share one."""
    if not compiler_cache.enabled():
        return
    cache_dir = compiler_cache.default_cache_dir()
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) prunes
        compiler_cache.prune(cache_dir)
    tag = hashlib.sha256(sys.executable.encode()).hexdigest()[:12]
    bin_dir = compiler_cache.install(cache_dir / f"bin-{tag}", cache_dir)
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != str(bin_dir)]
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), *rest])


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
    """Modules in order of weight (their heaviest test), each module's tests in file order. Under
    ``--dist loadscope`` xdist hands out the modules with the most tests first and keeps this order
    among modules with as many (pyproject says why xdist's reorder stays on)."""
    module_weight: dict[str, int] = {}
    for item in items:
        module_weight[item.module.__name__ if item.module else ""] = min(
            module_weight.get(item.module.__name__ if item.module else "", 0), _weight(item)
        )
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (module_weight[it.module.__name__ if it.module else ""], position[id(it)]))
