"""The ``jit`` layer's Inductor adapter end to end: real torch (CPU), a real kcache service, the
job (``kcache_testkit/cpu_jit_job.py``) as fresh interpreters on user-like nodes (own ``HOME`` and
``TMPDIR``, kcache only through ``KCACHE_URL``), every compiler run recorded by a ``PATH`` shim
(``kcache_testkit.compilers``: ``c++``, ``g++``, ``gcc``, ``cc``, ... log, then run the real one).

Node A compiles cold and uploads its C++ modules and ISA probe libraries, signed; node B, fresh,
runs no compiler at all (only the version probes torch's toolchain detection makes on every
node) and gets what a node with A's cache dirs copied in and kcache off gets. A damaged entry, on
the service or in a node's local tier, is a miss: the job compiles and gets the same result (one
damaged on the service is quarantined for every node besides).
"""

from __future__ import annotations

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
from kcache_schemas.signed_envelope import is_signed  # noqa: E402

from kcache_testkit.cpu_jit import JobRun, copy_warm, run_job  # noqa: E402
from kcache_testkit.nodes import Node  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]
WORKLOAD = "cpu-jit"


@dataclass
class Fleet:
    root: Path
    service: Any  # live.LiveService
    env: dict[str, str]  # what every node of the fleet is started with
    node_a: Node
    a: JobRun

    def client(self, namespace: str = "default") -> KcacheClient:
        return KcacheClient(ClientConfig(url=self.service.url, namespace=namespace))

    def workload_entries(self) -> list[tuple[str, str]]:
        view = self.client().get_json(f"/v1/default/workloads/{WORKLOAD}")
        return [(e["layer"], e["key"]) for e in view["entries"]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from live import LiveService

    root = tmp_path_factory.mktemp("jit-fleet")
    with LiveService(root / "service") as service:
        env = {"KCACHE_URL": service.url, "KCACHE_WORKLOAD": WORKLOAD, "KCACHE_SIGNING_KEY": "fleet-secret"}
        node_a = Node(root / "a")
        yield Fleet(root, service, env, node_a, run_job(node_a, **env))


def _kcache_lines(run: JobRun) -> list[str]:
    return [ln for ln in run.stderr.splitlines() if "kcache:" in ln]


def test_node_a_compiles_and_uploads_its_modules_signed(fleet: Fleet) -> None:
    a = fleet.a
    assert a.builds, "a cold node compiles"
    jit_layer = a.layer("jit")
    assert jit_layer["misses"] >= 2 and jit_layer["puts"] == jit_layer["misses"] and jit_layer["put_errors"] == 0, jit_layer
    assert not _kcache_lines(a), _kcache_lines(a)
    keys = [key for layer, key in fleet.workload_entries() if layer == "jit"]
    assert len(keys) == jit_layer["puts"] and all(k.startswith("inductor-cpp-v1:") for k in keys)
    stored, _ = fleet.client().get_entry("jit", keys[0])
    assert is_signed(stored)


def test_a_fresh_node_runs_no_compiler_and_gets_the_same_result(fleet: Fleet) -> None:
    b = run_job(Node(fleet.root / "b"), **fleet.env)
    copied = Node(fleet.root / "copied")
    copy_warm(fleet.node_a, copied)
    off = run_job(copied)  # kcache off: no KCACHE_URL
    assert b.builds == [], b.builds
    assert b.out == off.out == fleet.a.out
    jit_layer = b.layer("jit")
    assert jit_layer["hits"] == fleet.a.layer("jit")["puts"] and jit_layer["misses"] == 0 and jit_layer["errors"] == 0, jit_layer
    assert b.layer("fx-graph")["hits"] == 1
    assert not _kcache_lines(b), _kcache_lines(b)
    print(f"\nfirst call (s): cold {fleet.a.first_call_s:.2f}, kcache-warm {b.first_call_s:.2f}, copied-warm {off.first_call_s:.2f}; "
          f"compiler runs: cold {len(fleet.a.calls)} ({len(fleet.a.builds)} builds), kcache-warm {len(b.calls)} ({len(b.builds)}), "
          f"copied-warm {len(off.calls)} ({len(off.builds)})")


def _copy_namespace(fleet: Fleet, namespace: str, damage_jit: bool) -> list[str]:
    """Node A's entries in another namespace, the ``jit`` ones replaced by garbage if asked;
    returns the ``jit`` keys."""
    source, dest = fleet.client(), fleet.client(namespace)
    keys = []
    for layer, key in fleet.workload_entries():
        data, compile_time = source.get_entry(layer, key)
        if layer == "jit":
            keys.append(key)
            if damage_jit:
                data = b"\x7fELF" + bytes(64)  # neither signed nor a container: refused unread
        dest.put_entry(layer, key, data, compile_time)
    return keys


def test_a_damaged_entry_on_the_service_is_a_miss(fleet: Fleet) -> None:
    keys = _copy_namespace(fleet, "damaged", damage_jit=True)
    c = run_job(Node(fleet.root / "c"), KCACHE_URL=fleet.service.url, KCACHE_NAMESPACE="damaged")
    assert c.out == fleet.a.out
    assert c.builds, "the job compiles what kcache refused"
    jit_layer = c.layer("jit")
    # Each one refused and quarantined for every node (the container check is the same everywhere).
    assert jit_layer["hits"] == 0 and jit_layer["error_kinds"] == {"invalid_entry": len(keys), "quarantined": len(keys)}, jit_layer
    assert all(fleet.client("damaged").quarantine_info("jit", key).reason.startswith("damaged:") for key in keys)
    assert c.layer("fx-graph")["hits"] == 1  # the rest of the fleet's cache still serves


def test_a_module_that_does_not_load_is_a_miss(fleet: Fleet) -> None:
    """A well-formed entry whose shared object is broken (here: put in the node's local tier,
    read before the service) is written, fails to load, is taken back, and Inductor compiles."""
    keys = _copy_namespace(fleet, "plain", damage_jit=False)
    node = Node(fleet.root / "d")
    config = ClientConfig(url=fleet.service.url, namespace="plain", local_dir=str(node.home / ".cache" / "kcache" / "client"))
    broken = jit.encode("inductor-cpp", {"target": b"\x7fELF" + bytes(60)})  # an ELF header only
    for key in keys:
        LocalEntryStore.of(config).put("jit", key, broken)
    d = run_job(node, KCACHE_URL=fleet.service.url, KCACHE_NAMESPACE="plain")
    assert d.out == fleet.a.out
    assert d.builds, "the job compiles what did not load"
    jit_layer = d.layer("jit")
    assert jit_layer["error_kinds"].get("refused", 0) == len(keys), jit_layer
    assert any("did not load" in ln for ln in _kcache_lines(d)), d.stderr[-2000:]
