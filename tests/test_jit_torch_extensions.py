"""The ``jit`` layer's adapter for torch's extension JIT (kcache.layers.jit.torch_extensions) end to end: a
``load_inline`` extension (``kcache_testkit/cpp_extension_job.py``) built with ninja by node A in
its ``HOME``; node B (another ``HOME``: another build dir, no ninja log, other mtimes) loads it
with no compiler run (a ``PATH`` shim records every one) and the same result. A library that does
not import is a miss: ninja builds it and the job gets the same result."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kcache.config import ClientConfig  # noqa: E402
from kcache.store.local_store import LocalEntryStore  # noqa: E402
from kcache.transport.http import KcacheClient  # noqa: E402
from kcache_schemas import jit  # noqa: E402

from kcache_testkit.cpu_jit import EXTENSION_JOB, JobRun, run_job  # noqa: E402
from kcache_testkit.nodes import Node  # noqa: E402
from kcache_testkit.pace import HANG_S  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]
needs_ninja = pytest.mark.skipif(shutil.which("ninja") is None, reason="torch's extension JIT needs ninja")
WORKLOAD = "extension-jit"


@dataclass
class Fleet:
    root: Path
    service: Any  # live.LiveService
    env: dict[str, str]
    a: JobRun


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from live import LiveService

    root = tmp_path_factory.mktemp("extension-fleet")
    with LiveService(root / "service") as service:
        env = {"KCACHE_URL": service.url, "KCACHE_WORKLOAD": WORKLOAD, "KCACHE_SIGNING_KEY": "fleet-secret"}
        yield Fleet(root, service, env, run_job(Node(root / "a"), job=EXTENSION_JOB, **env))


def _keys(fleet: Fleet) -> list[str]:
    view = KcacheClient(ClientConfig(url=fleet.service.url, read_timeout_s=HANG_S)).get_json(f"/v1/default/workloads/{WORKLOAD}")
    return [e["key"] for e in view["entries"] if e["layer"] == "jit"]


@needs_ninja
def test_node_a_builds_with_ninja_and_uploads_the_library(fleet: Fleet) -> None:
    assert any("-shared" in call for call in fleet.a.builds), fleet.a.builds  # ninja compiled and linked
    assert fleet.a.layer("jit")["puts"] == 1 and fleet.a.layer("jit")["misses"] == 1
    [key] = _keys(fleet)
    assert key.startswith("cpp-extension-v1:")


@needs_ninja
def test_another_home_loads_it_without_a_compiler(fleet: Fleet) -> None:
    b = run_job(Node(fleet.root / "b"), job=EXTENSION_JOB, **fleet.env)
    assert b.builds == [], b.builds
    assert b.out == fleet.a.out
    assert b.layer("jit")["hits"] == 1 and b.layer("jit")["errors"] == 0
    assert not [ln for ln in b.stderr.splitlines() if "kcache:" in ln]
    print(f"\nload_inline (s): node A {fleet.a.first_call_s:.2f} ({len(fleet.a.builds)} compiler builds), "
          f"node B {b.first_call_s:.3f} ({len(b.calls)} compiler runs, all version probes)")


@needs_ninja
def test_a_library_that_does_not_import_is_built_by_ninja(fleet: Fleet) -> None:
    node = Node(fleet.root / "c")
    config = ClientConfig(url=fleet.service.url, local_dir=str(node.home / ".cache" / "kcache" / "client"))
    for key in _keys(fleet):  # read before the service: a well-formed entry, a broken library
        LocalEntryStore.of(config).put("jit", key, jit.encode("cpp-extension", {"target": b"\x7fELF" + bytes(60)}))
    c = run_job(node, job=EXTENSION_JOB, KCACHE_URL=fleet.service.url)
    assert c.out == fleet.a.out
    assert c.builds, "ninja built what did not import"
    assert c.layer("jit")["error_kinds"] == {"refused": 1}, c.layer("jit")
    assert any("did not import" in ln for ln in c.stderr.splitlines()), c.stderr[-2000:]


def test_the_hooks_come_and_go_with_kcache_and_the_layer(tmp_path: Path) -> None:
    import kcache
    from torch.utils import cpp_extension

    from kcache_testkit.ports import free_port

    names = ("_write_ninja_file_and_build_library", "_run_ninja_build", "_import_module_from_library")
    originals = {n: getattr(cpp_extension, n) for n in names}
    url = f"http://127.0.0.1:{free_port()}"
    try:
        assert kcache.install(url=url)
        assert all(getattr(cpp_extension, n) is not originals[n] for n in names)
        kcache.uninstall()
        assert all(getattr(cpp_extension, n) is originals[n] for n in names)
        assert kcache.install(url=url, layers="fx-graph")
        assert all(getattr(cpp_extension, n) is originals[n] for n in names)
    finally:
        kcache.uninstall()
