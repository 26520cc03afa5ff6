"""FX-graph entries: stored as raw pickles, served to Inductor's JSON readers unchanged.

The fleet test (test_fleet.py) drives the read path with a real CPU compile; here the envelope and
the backend through torch's real ``RemoteFxGraphCache`` class against a live service."""

from __future__ import annotations

import base64
import json
import pickle

import pytest
from kcache.config import ClientConfig
from kcache.store import fx_graph_envelope as fx
from kcache.transport.http import KcacheClient

from kcache_testkit.pace import HANG_S

pytestmark = pytest.mark.torch

pytest_plugins = ["live"]


def _inductor_entry(obj: object, time_taken_ms: int = 1234) -> tuple[dict[str, object], bytes]:
    """What FxGraphCache._save_graph hands its remote cache, and the JSON serde's bytes of it."""
    entry = {"data": base64.b64encode(pickle.dumps(obj)).decode("ascii"), "time_taken_ms": time_taken_ms}
    return entry, json.dumps(entry).encode("ascii")


def test_the_envelope_holds_the_raw_pickle_and_gives_inductor_its_json_back() -> None:
    graph = {"kernels": [bytes(range(256)) * 64], "name": "g"}
    entry, as_json = _inductor_entry(graph)
    stored = fx.encode(as_json)
    assert stored is not None and stored.startswith(fx.MAGIC)
    assert len(stored) < len(as_json) * 0.8  # base64 is gone
    assert fx.pickled_graph(stored) == pickle.dumps(graph)
    assert json.loads(fx.inductor_json(stored)) == entry
    # Entries stored before the envelope (plain JSON) read as before.
    assert fx.inductor_json(as_json) == as_json
    assert fx.pickled_graph(as_json) == pickle.dumps(graph)


@pytest.mark.parametrize("odd", [b"not json", b"[1, 2]", b'{"data": 3}', b'{"other": "x"}', b'{"data": "%%%"}'])
def test_entries_of_another_shape_are_stored_as_they_came(odd: bytes) -> None:
    assert fx.encode(odd) is None


def test_a_damaged_envelope_is_an_error_not_a_graph() -> None:
    _, as_json = _inductor_entry({"x": 1})
    stored = fx.encode(as_json)
    assert stored is not None
    truncated = stored[: len(fx.MAGIC) + 5]
    with pytest.raises(ValueError):
        fx.pickled_graph(truncated)
    with pytest.raises(ValueError):
        fx.inductor_json(fx.MAGIC + (10).to_bytes(4, "big") + b"[1,2,3,4]")  # header not an object


def test_torch_remote_fx_graph_cache_round_trips_through_the_service(live_service) -> None:
    pytest.importorskip("torch")
    import kcache
    from kcache.current import get_runtime
    from torch._inductor.remote_cache import RemoteFxGraphCache

    graph = {"kernels": [b"\x00cubin" * 1000]}
    entry, _ = _inductor_entry(graph, time_taken_ms=4200)
    assert kcache.install(url=live_service.url)
    try:
        cache = RemoteFxGraphCache("fx-graph-v1")
        cache.put("abc", entry)
        rt = get_runtime()
        assert rt is not None and rt.uploader is not None and rt.uploader.flush(10)
        # Stored as the envelope, credited with Inductor's compile time ...
        stored, compile_time = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S)).get_entry("fx-graph", "pt2:fx-graph-v1::abc:c1")
        assert stored.startswith(fx.MAGIC) and fx.pickled_graph(stored) == pickle.dumps(graph)
        assert compile_time == pytest.approx(4.2)
        # ... and Inductor's own get() still decodes what it put.
        assert cache.get("abc") == entry
    finally:
        kcache.uninstall()
