"""Uploads stay off the compile path: payloads are made in the uploader thread, uploads wait for a
quiet moment of the compile path, and a flush (at exit) sends everything at once. Against a real
``kcache serve``; the last test is a real interpreter that compiles with Inductor and exits at once."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kcache.config import ClientConfig
from kcache.exceptions import NotFound
from kcache.runtime import Runtime
from kcache.store import fx_graph_envelope as fx
from kcache.transport.http import KcacheClient
from kcache.transport.uploader import QUIET_S

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S

pytestmark = pytest.mark.torch

pytest_plugins = ["live"]

LAYER = "autotune"


def _stored(url: str, namespace: str, layer: str, key: str) -> bytes | None:
    client = KcacheClient(ClientConfig(url=url, namespace=namespace))
    try:
        return client.get_entry(layer, key)[0]
    except NotFound:
        return None
    finally:
        client.close()


def _runtime(url: str, namespace: str, **overrides: object) -> Runtime:
    return Runtime(ClientConfig(url=url, namespace=namespace, mode="readwrite", **overrides))  # type: ignore[arg-type]


@contextlib.contextmanager
def compiling(rt: Runtime) -> Iterator[None]:
    """A compile calling kcache's hooks every 20 ms, in a thread of its own, while the body runs."""
    stop = threading.Event()

    def hooks() -> None:
        while not stop.is_set():
            rt.compile_activity()
            stop.wait(0.02)

    thread = threading.Thread(target=hooks)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_uploads_wait_while_the_compile_path_is_busy_and_a_flush_sends_them_at_once(live_service) -> None:
    rt = _runtime(live_service.url, "quiet-flush")
    try:
        keys = [f"pt2:autotune-v1::busy{i}:c1" for i in range(6)]
        with compiling(rt):
            for i, key in enumerate(keys):
                rt.put_entry(LAYER, key, json.dumps({"i": i}).encode())
            time.sleep(3 * QUIET_S)
            assert [_stored(live_service.url, "quiet-flush", LAYER, k) for k in keys] == [None] * 6, "sent while the compile path was busy"
            assert rt.uploader is not None and rt.uploader.flush(HANG_S)  # exit: everything, busy or not
            assert [json.loads(_stored(live_service.url, "quiet-flush", LAYER, k) or b"null") for k in keys] == [{"i": i} for i in range(6)]
    finally:
        rt.close()


def test_uploads_go_once_the_compile_path_is_quiet(live_service) -> None:
    rt = _runtime(live_service.url, "quiet-idle")
    try:
        rt.put_entry(LAYER, "pt2:autotune-v1::idle:c1", b'{"best": 1}')
        deadline = time.monotonic() + HANG_S
        while _stored(live_service.url, "quiet-idle", LAYER, "pt2:autotune-v1::idle:c1") is None:
            assert time.monotonic() < deadline, "never sent although the compile path went quiet"
            time.sleep(0.05)
        assert rt.uploader is not None and rt.uploader.idle()
    finally:
        rt.close()


def test_a_half_full_queue_is_sent_without_waiting_for_quiet(live_service) -> None:
    """A long compile never fills the queue to the point of dropping uploads."""
    rt = _runtime(live_service.url, "quiet-full", upload_queue=8)
    try:
        keys = [f"pt2:autotune-v1::full{i}:c1" for i in range(8)]
        for i, key in enumerate(keys):
            rt.put_entry(LAYER, key, json.dumps({"i": i}).encode())
        deadline = time.monotonic() + HANG_S
        with compiling(rt):  # busy all along
            while _stored(live_service.url, "quiet-full", LAYER, keys[0]) is None:
                assert time.monotonic() < deadline, "a half-full queue waited for quiet"
                time.sleep(0.02)
        assert rt.uploader is not None and rt.uploader.flush(HANG_S)
        assert rt.stats.snapshot()[LAYER].put_errors == 0 and rt.stats.snapshot()[LAYER].puts == 8
    finally:
        rt.close()


def test_an_fx_entry_is_made_in_the_uploader_thread_and_stored_once_as_the_envelope(live_service, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor hands its remote cache base64 inside JSON; turning that into kcache's envelope
    (json.loads, a2b_base64 of up to hundreds of MB) is done by the uploader, not the compile."""
    pytest.importorskip("torch")
    import kcache
    from kcache.current import get_runtime
    from torch._inductor.remote_cache import RemoteFxGraphCache

    made_in: list[str] = []
    encode = fx.encode

    def recording_encode(inductor_json: bytes) -> bytes | None:
        made_in.append(threading.current_thread().name)
        return encode(inductor_json)

    monkeypatch.setattr(fx, "encode", recording_encode)
    graph = {"kernels": [b"\x00cubin" * 1000]}
    entry = {"data": base64.b64encode(pickle.dumps(graph)).decode("ascii"), "time_taken_ms": 4200}
    assert kcache.install(url=live_service.url, namespace="fx-thread")
    try:
        RemoteFxGraphCache("fx-graph-v1").put("thread", entry)
        assert made_in == []  # nothing made on the compile path
        rt = get_runtime()
        assert rt is not None and rt.uploader is not None and rt.uploader.flush(HANG_S)
        assert made_in == ["kcache-uploader"]
        stored = _stored(live_service.url, "fx-thread", "fx-graph", "pt2:fx-graph-v1::thread:c1")
        assert stored is not None and stored.startswith(fx.MAGIC) and fx.pickled_graph(stored) == pickle.dumps(graph)
    finally:
        kcache.uninstall()


_COMPILE_AND_EXIT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
print(torch.compile(model)(torch.randn(2, 16)).shape)
"""


def test_a_job_that_compiles_and_exits_at_once_uploads_every_entry(live_service, tmp_path: Path) -> None:
    """The user's default path: ``KCACHE_URL`` set, a compile, exit right after (the compile path
    was busy until the end, so every upload waits for the exit's flush). Nothing is lost."""
    node = Node(tmp_path / "node")
    stats = tmp_path / "stats.json"
    env = node.env(KCACHE_URL=live_service.url, KCACHE_NAMESPACE="exit-at-once", KCACHE_STATS_FILE=str(stats),
                   PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _COMPILE_AND_EXIT], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert [ln for ln in out.stderr.splitlines() if ln.startswith("kcache:")] == []
    layers = json.loads(stats.read_text())["layers"]
    assert sum(v["put_errors"] for v in layers.values()) == 0, layers
    client = KcacheClient(ClientConfig(url=live_service.url, namespace="exit-at-once"))
    try:
        uploaded = {layer: v["puts"] for layer, v in layers.items() if v["puts"] and layer != "kernel"}
        assert {"fx-graph", "jit", "key-components"} <= set(uploaded), layers
        assert {layer: len(list(client.list_entries(layer))) for layer in uploaded} == uploaded
    finally:
        client.close()
