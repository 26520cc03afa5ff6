"""The ``jit`` layer's adapter for tvm-ffi's JIT (kcache.layers.jit.tvm_ffi, FlashInfer's builder) end to
end: a ``tvm_ffi.cpp.load_inline`` module (``kcache_testkit/tvm_ffi_job.py``) built with ninja by
node A in its ``HOME``; node B (another ``HOME``: another build dir, no ninja log, other mtimes)
loads it with no compiler run (a ``PATH`` shim records every one) and the same result. A damaged
entry is a miss: from the service, it is quarantined for every node; in a node's local tier, it
is dropped and the service's whole copy is used. A library that does not load is built by ninja.

tvm-ffi is in the dev extra (a 3.3 MB wheel); without it (a client-only install) these skip."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed (it is in the dev extra)")
torch = pytest.importorskip("torch")  # tvm_ffi imports torch first when it is installed

from kcache.config import ClientConfig  # noqa: E402
from kcache.store.local_store import LocalEntryStore  # noqa: E402
from kcache.transport.http import KcacheClient  # noqa: E402
from kcache_schemas import jit  # noqa: E402
from kcache_schemas.signed_envelope import is_signed  # noqa: E402
from kcache_schemas.signed_envelope import parse as parse_envelope  # noqa: E402

from kcache_testkit.cpu_jit import TVM_FFI_JOB, JobRun, run_job  # noqa: E402
from kcache_testkit.nodes import Node  # noqa: E402
from kcache_testkit.pace import HANG_S  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.skipif(shutil.which("ninja") is None, reason="tvm-ffi's JIT needs ninja"),
]
WORKLOAD = "tvm-ffi-jit"


@dataclass
class Fleet:
    root: Path
    service: Any  # live.LiveService
    env: dict[str, str]
    a: JobRun

    def client(self, namespace: str = "default") -> KcacheClient:
        return KcacheClient(ClientConfig(url=self.service.url, namespace=namespace, read_timeout_s=HANG_S))

    def key(self) -> str:
        view = self.client().get_json(f"/v1/default/workloads/{WORKLOAD}")
        [key] = [e["key"] for e in view["entries"] if e["layer"] == "jit"]
        return str(key)

    def payload(self) -> bytes:
        """Node A's entry as the adapter reads it (the signed envelope opened)."""
        stored, _ = self.client().get_entry("jit", self.key())
        return parse_envelope(stored).payload() if is_signed(stored) else stored


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from live import LiveService

    root = tmp_path_factory.mktemp("tvm-ffi-fleet")
    with LiveService(root / "service") as service:
        env = {"KCACHE_URL": service.url, "KCACHE_WORKLOAD": WORKLOAD, "KCACHE_SIGNING_KEY": "fleet-secret"}
        yield Fleet(root, service, env, run_job(Node(root / "a"), job=TVM_FFI_JOB, **env))


def _kcache_lines(run: JobRun) -> list[str]:
    return [ln for ln in run.stderr.splitlines() if "kcache:" in ln]


def _damaged(payload: bytes) -> bytes:
    """The container with its library's last byte flipped: its sha256 no longer matches."""
    damaged = bytearray(payload)
    damaged[-1] ^= 0xFF
    return bytes(damaged)


def test_node_a_builds_with_ninja_and_uploads_the_module(fleet: Fleet) -> None:
    assert any("-shared" in call for call in fleet.a.builds), fleet.a.builds  # ninja compiled and linked
    assert fleet.a.out == [17.0, 11.0]
    assert fleet.a.layer("jit")["puts"] == 1 and fleet.a.layer("jit")["misses"] == 1
    assert fleet.key().startswith("tvm-ffi-v1:")
    assert jit.decode(fleet.payload()).adapter == "tvm-ffi"
    assert not _kcache_lines(fleet.a), _kcache_lines(fleet.a)


def test_another_home_loads_it_without_a_compiler(fleet: Fleet) -> None:
    b = run_job(Node(fleet.root / "b"), job=TVM_FFI_JOB, **fleet.env)
    assert b.builds == [], b.builds  # only kcache's `c++ -v` probe for the key's compiler banner
    assert b.out == fleet.a.out
    assert b.layer("jit")["hits"] == 1 and b.layer("jit")["errors"] == 0
    assert not _kcache_lines(b), _kcache_lines(b)
    print(f"\ntvm_ffi.cpp.load_inline (s): node A {fleet.a.first_call_s:.2f} ({len(fleet.a.builds)} compiler builds), "
          f"node B {b.first_call_s:.3f} ({len(b.calls)} compiler runs)")


def test_a_damaged_entry_from_the_service_is_quarantined_for_every_node(fleet: Fleet) -> None:
    key, namespace = fleet.key(), "damaged"
    fleet.client(namespace).put_entry("jit", key, _damaged(fleet.payload()))  # a producer's bad upload
    c = run_job(Node(fleet.root / "c"), job=TVM_FFI_JOB, KCACHE_URL=fleet.service.url, KCACHE_NAMESPACE=namespace)
    assert c.out == fleet.a.out
    assert any("-shared" in call for call in c.builds), "ninja built what kcache refused"
    layer = c.layer("jit")
    assert layer["hits"] == 0 and layer["error_kinds"] == {"invalid_entry": 1, "quarantined": 1}, layer
    assert layer["puts"] == 0  # what it built is not offered under a quarantined key
    assert any("quarantined for every node" in ln for ln in _kcache_lines(c)), c.stderr[-2000:]
    info = fleet.client(namespace).quarantine_info("jit", key)
    assert info.reason.startswith("damaged:") and info.entry is not None
    with pytest.raises(Exception, match="quarantined"):
        fleet.client(namespace).get_entry("jit", key)  # no other node receives it


def test_a_damaged_local_copy_is_dropped_and_the_service_serves(fleet: Fleet) -> None:
    """A node's own disk damaged the copy: the service's is whole, so nothing is quarantined."""
    node = Node(fleet.root / "d")
    local = LocalEntryStore.of(ClientConfig(url=fleet.service.url, local_dir=str(node.home / ".cache" / "kcache" / "client")))
    local.put("jit", fleet.key(), _damaged(fleet.payload()))
    d = run_job(node, job=TVM_FFI_JOB, KCACHE_URL=fleet.service.url)  # not verifying: the damage is the container's
    assert d.builds == [], d.builds
    assert d.out == fleet.a.out
    layer = d.layer("jit")
    assert layer["hits"] == 1 and layer["error_kinds"] == {"invalid_entry": 1}, layer
    assert fleet.client().get_entry("jit", fleet.key())  # still served


def test_a_library_that_does_not_load_is_built_by_ninja(fleet: Fleet) -> None:
    node = Node(fleet.root / "e")
    local = LocalEntryStore.of(ClientConfig(url=fleet.service.url, local_dir=str(node.home / ".cache" / "kcache" / "client")))
    local.put("jit", fleet.key(), jit.encode("tvm-ffi", {"target": b"\x7fELF" + bytes(60)}))  # whole, but no library
    e = run_job(node, job=TVM_FFI_JOB, KCACHE_URL=fleet.service.url)
    assert e.out == fleet.a.out
    assert e.builds, "ninja built what did not load"
    assert e.layer("jit")["error_kinds"] == {"refused": 1}, e.layer("jit")
    assert any("did not load" in ln for ln in _kcache_lines(e)), e.stderr[-2000:]


def test_the_hooks_come_and_go_with_kcache_and_the_layer() -> None:
    import kcache
    from tvm_ffi.cpp import extension

    from kcache_testkit.ports import free_port

    names = ("build_ninja", "load_module")
    originals = {n: getattr(extension, n) for n in names}
    url = f"http://127.0.0.1:{free_port()}"
    try:
        assert kcache.install(url=url)
        assert all(getattr(extension, n) is not originals[n] for n in names)
        kcache.uninstall()
        assert all(getattr(extension, n) is originals[n] for n in names)
        assert kcache.install(url=url, layers="fx-graph")
        assert all(getattr(extension, n) is originals[n] for n in names)
    finally:
        kcache.uninstall()
