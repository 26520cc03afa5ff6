"""The client fails open: a dead, hung, failing or trickling service never fails or stalls a compile.

Everything is real: the client (``kcache.runtime.Runtime`` over ``KcacheClient`` over httpx), the
misbehaving servers (real sockets in ``kcache_testkit.netfaults``), the service (``kcache serve``), the kernels
(compiled by Triton on the CPU) and Inductor's ``TritonBundler``.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kcache
import pytest
from kcache.config import ClientConfig
from kcache.current import get_runtime
from kcache.runtime import Runtime
from kcache.store.emitter import EmitOutcome
from kcache.transport.http import KcacheClient
from kcache_schemas.keys import hex_to_kernel_key
from kcache_schemas.stats_document import LayerCounts

from kcache_testkit.kernels import Kernel, real_kernels
from kcache_testkit.netfaults import FaultServer
from kcache_testkit.pace import HANG_S, bound
from kcache_testkit.service import ServerProcess, clean_env

pytestmark = pytest.mark.torch

CONNECT, READ, RETRIES, FAILURES = 0.2, 0.5, 1, 3
# (connect + read) per attempt, every attempt; the slack covers the 50 ms retry backoff, one
# trickle interval (a deadline is checked when a byte arrives) and a loaded CI machine.
# Bounds are the configured deadlines plus a multiple of the machine's pace measured in the test
# (kcache_testkit.pace): about 0.5 s and 10 ms on an idle machine, more on a loaded one.
DEADLINES_S = (CONNECT + READ) * (1 + RETRIES)
SLACK_PROBES = 1000
OPEN_CALL_PROBES = 20  # a call while the breaker is open must not touch the network
SUBMIT_MAX_PROBES = 200  # the slowest of many upload submits (one may be preempted)
ABSENT_KEY = hex_to_kernel_key(hashlib.sha256(b"kcache fail-open test: never stored").hexdigest())
LAYER = "fx-graph"
ENTRY_KEY = "pt2:fx-graph-v1::failopen:c1"

# name -> (mode, trickle interval). "trickle" sends the whole response a byte per second (the
# per-read timeout fires); "drip" sends headers at once, then a body byte every 0.2 s, faster
# than the read timeout: only the client's total deadline stops it.
FAULTS = {
    "refused": ("refuse", 1.0),
    "blackhole": ("hang", 1.0),
    "http500": ("http500", 1.0),
    "trickle": ("trickle", 1.0),
    "drip": ("drip", 0.2),
}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> list[Kernel]:
    return real_kernels(tmp_path_factory.mktemp("failopen-triton"), count=3)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("failopen-service")
    with ServerProcess(root / "data", root, env=clean_env(KCACHE_AUTOLOAD="0")) as svc:
        yield svc


@pytest.fixture(params=sorted(FAULTS))
def fault(request: pytest.FixtureRequest) -> Iterator[FaultServer]:
    mode, interval = FAULTS[request.param]
    with FaultServer(mode, trickle_interval=interval) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_kcache_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("KCACHE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path / "kcache-local"))  # the local entry tier


def config(url: str, **overrides: Any) -> ClientConfig:
    values: dict[str, Any] = {
        "url": url,
        "connect_timeout_s": CONNECT,
        "read_timeout_s": READ,
        "retries": RETRIES,
        "breaker_failures": FAILURES,
        "breaker_reset_s": 60.0,
        "mode": "readonly",
        "namespace": f"t{uuid.uuid4().hex[:12]}",
    }
    values.update(overrides)
    return ClientConfig(**values)


def compile_path_calls(cache_dir: Path) -> dict[str, Callable[[Runtime], Any]]:
    return {
        "fetch_kernel": lambda rt: rt.fetch_kernel(ABSENT_KEY, cache_dir),
        "get_entry": lambda rt: rt.get_entry(LAYER, ENTRY_KEY),
        "missing_kernels": lambda rt: rt.missing_kernels([ABSENT_KEY]),
    }


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def totals(rt: Runtime) -> dict[str, int]:
    snap = rt.stats.snapshot()
    return {k: sum(getattr(layer, k) for layer in snap.values()) for k in ("hits", "misses", "errors")}


def kernel_counts(rt: Runtime) -> LayerCounts:
    return rt.stats.snapshot().get("kernel") or LayerCounts()


def wait_for(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# ---- compile-path calls --------------------------------------------------------------------


def test_calls_fail_open_within_budget_then_breaker_keeps_off_network(fault: FaultServer, tmp_path: Path) -> None:
    cache_dir = tmp_path / "triton"
    rt = Runtime(config(fault.url))
    assert rt.client is not None
    try:
        for name, call in compile_path_calls(cache_dir).items():
            result, elapsed = timed(lambda call=call: call(rt))
            assert result is None, name
            budget = bound(DEADLINES_S, SLACK_PROBES)
            assert elapsed < budget, f"{name} took {elapsed:.2f}s, budget {budget:.2f}s"

        snap = rt.stats.snapshot()
        assert snap["kernel"].errors == 2 and snap[LAYER].errors == 1, snap
        assert totals(rt) == {"hits": 0, "misses": 0, "errors": 3}, "a failing service is an error, not a miss"
        assert set(snap["kernel"].error_kinds) == {"ServiceUnavailable"}
        assert rt.client.breaker.state == "open"

        # Open: calls return at once and the server sees nothing new.
        time.sleep(0.05)
        seen = (fault.connections, fault.requests)
        took: dict[str, list[float]] = {}
        for _round in range(3):
            for name, call in compile_path_calls(cache_dir).items():
                result, elapsed = timed(lambda call=call: call(rt))
                assert result is None, name
                took.setdefault(name, []).append(elapsed)
        # The median of three: one call preempted on a loaded machine is not a network wait (the
        # connection counts below are the proof that nothing reached the server).
        for name, times in took.items():
            assert statistics.median(times) < bound(0, OPEN_CALL_PROBES), f"{name} took {times} s with the breaker open"
        time.sleep(0.1)
        assert (fault.connections, fault.requests) == seen
        assert totals(rt) == {"hits": 0, "misses": 0, "errors": 12}
        assert not cache_dir.exists() or not any(cache_dir.iterdir())
    finally:
        rt.close()


@pytest.mark.slow
def test_half_open_lets_one_probe_through_and_a_recovered_service_closes_it(
    fault: FaultServer, service: ServerProcess, tmp_path: Path
) -> None:
    reset = 1.0
    rt = Runtime(config(fault.url, breaker_reset_s=reset))
    assert rt.client is not None
    breaker = rt.client.breaker
    fetch = compile_path_calls(tmp_path / "triton")["fetch_kernel"]
    try:
        for _ in range(FAILURES):
            assert fetch(rt) is None
        assert breaker.state == "open" and breaker.times_opened == 1

        # Half-open while the fault persists: one probe reaches the network; concurrent
        # callers do not wait for it; its failure re-opens the breaker at once.
        wait_for(lambda: breaker.state == "half-open", reset + 1.0)
        time.sleep(0.05)
        before = fault.connections
        probe_result: list[Any] = []
        probe = threading.Thread(target=lambda: probe_result.append(fetch(rt)))
        probe.start()
        time.sleep(0.02)
        while probe.is_alive():
            result, elapsed = timed(lambda: fetch(rt))
            # Waiting behind the probe would take its connect deadline at least.
            assert result is None and elapsed < min(CONNECT, bound(0, SUBMIT_MAX_PROBES)), f"caller waited {elapsed * 1e3:.1f} ms behind the probe"
            time.sleep(0.05)
        probe.join()
        assert probe_result == [None]
        time.sleep(0.05)
        assert fault.connections - before <= 1 + RETRIES, "more than one probe went through"
        if fault.mode != "refuse":
            assert fault.connections > before, "the probe never reached the server"
        assert breaker.state == "open" and breaker.times_opened == 2
        assert totals(rt)["misses"] == 0

        # The service comes back behind the same address: the next probe closes the breaker.
        fault.set_mode("proxy", upstream=service.url)
        wait_for(lambda: breaker.state == "half-open", reset + 1.0)
        assert fetch(rt) is None
        assert breaker.state == "closed"
        assert rt.stats.snapshot()["kernel"].misses == 1, "a 404 from a healthy service is a miss"
        assert rt.get_entry(LAYER, ENTRY_KEY) is None  # went through: a miss, not an error
        assert rt.missing_kernels([ABSENT_KEY]) == [ABSENT_KEY]
        assert totals(rt)["misses"] == 2 and breaker.state == "closed"
    finally:
        rt.close()


@pytest.mark.slow
def test_real_service_counts_misses_as_misses_and_hits_as_hits(
    service: ServerProcess, kernels: list[Kernel], tmp_path: Path
) -> None:
    cfg = config(service.url, read_timeout_s=10.0, connect_timeout_s=2.0)
    rt = Runtime(cfg)
    dest = tmp_path / "triton"
    try:
        assert rt.fetch_kernel(ABSENT_KEY, dest) is None
        assert rt.get_entry(LAYER, ENTRY_KEY) is None
        k = kernels[0]
        assert rt.missing_kernels([k.key, ABSENT_KEY]) == [k.key, ABSENT_KEY]
        snap = rt.stats.snapshot()
        assert snap["kernel"].misses == 1 and snap["kernel"].miss_reasons == {"not_found": 1}
        assert snap[LAYER].misses == 1
        assert totals(rt)["errors"] == 0

        uploader = KcacheClient(cfg)
        try:
            assert uploader.put_pack(k.key, k.pack) is True
        finally:
            uploader.close()
        assert rt.missing_kernels([k.key, ABSENT_KEY]) == [ABSENT_KEY]
        assert rt.fetch_kernel(k.key, dest) is EmitOutcome.EMITTED
        group = json.loads((dest / k.key / f"__grp__{k.name}.json").read_text())
        assert all(Path(p).parent == dest / k.key and Path(p).is_file() for p in group["child_paths"].values())
        assert totals(rt) == {"hits": 1, "misses": 2, "errors": 0}
        assert rt.client is not None and rt.client.breaker.state == "closed"
    finally:
        rt.close()


# ---- uploads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["refuse", "hang"])
def test_uploads_never_block_the_caller_and_close_is_bounded(mode: str, kernels: list[Kernel]) -> None:
    flush = 1.0
    with FaultServer(mode) as fault:
        rt = Runtime(config(fault.url, mode="readwrite", flush_timeout_s=flush, upload_queue=4))
        assert rt.uploader is not None
        waits = []
        for k in kernels:
            _, elapsed = timed(lambda k=k: rt.upload_kernel(k.key, k.files, 1.0))
            waits.append(elapsed)
        for i in range(20):  # more than the queue holds: dropped and counted, never waited for
            _, elapsed = timed(lambda i=i: rt.put_entry(LAYER, f"{ENTRY_KEY}{i}", b"x" * 4096, 1.0))
            waits.append(elapsed)
        # Typical submits take no time; none waits as long as a network call would (READ).
        assert statistics.median(waits) < bound(0, OPEN_CALL_PROBES), f"submits took {statistics.median(waits) * 1e3:.1f} ms"
        assert max(waits) < min(READ, bound(0, SUBMIT_MAX_PROBES)), f"a submit blocked for {max(waits) * 1e3:.1f} ms"

        _, elapsed = timed(rt.close)
        if mode == "refuse":  # known dead after its first refusal: exit does not wait for it
            assert elapsed < bound(0, SLACK_PROBES), f"close() took {elapsed:.2f}s with a service that refuses"
        else:  # not known dead (it may just be slow): exit waits, but never past the cap
            assert elapsed < bound(flush, SLACK_PROBES), f"close() took {elapsed:.2f}s, past the {flush}s cap"
        if mode == "refuse":  # fast failures: the uploader accounts for them right after
            deadline = time.monotonic() + HANG_S  # a hang guard: the loop ends with the count
            while kernel_counts(rt).put_errors < len(kernels) and time.monotonic() < deadline:
                time.sleep(0.02)
        snap = rt.stats.snapshot()
        dropped = snap[LAYER].error_kinds.get("queue_full", 0)
        assert dropped >= 20 - 4, snap
        assert totals(rt)["hits"] == 0 and kernel_counts(rt).puts == 0
        if mode == "refuse":  # every upload is accounted for: refused, or dropped at exit
            assert snap["kernel"].put_errors == len(kernels)
            kinds = snap["kernel"].error_kinds
            assert set(kinds) <= {"ServiceUnavailable", "dropped_at_exit"} and sum(kinds.values()) == len(kernels), kinds


# ---- through Inductor's real TritonBundler ----------------------------------------------------

WRAPPED = ("begin_compile", "put", "put_winner", "collect", "read_and_emit")


def run_bundler(src: Path, dst: Path, keys: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, float]:
    """begin_compile / put / collect from ``src``, then read_and_emit into ``dst``."""
    from torch._inductor.triton_bundler import TritonBundler

    t0 = time.perf_counter()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(src))  # Inductor's triton_cache_dir(device)
    TritonBundler.begin_compile()
    for key in keys:
        TritonBundler.put(key, 0)
    bundle, _meta = TritonBundler.collect()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(dst))
    metadata = TritonBundler.read_and_emit(bundle)
    return bundle, metadata, time.perf_counter() - t0


@pytest.mark.parametrize("mode", ["refuse", "hang"])
def test_bundler_hooks_with_a_dead_service(
    mode: str, kernels: list[Kernel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from torch._inductor import config as inductor_config
    from torch._inductor.triton_bundler import TritonBundler

    src = kernels[0].dir.parent
    keys = [k.key for k in kernels]
    before = {n: TritonBundler.__dict__.get(n) for n in WRAPPED}
    env_before = {k: v for k, v in os.environ.items() if k.startswith("KCACHE_") or k == "TRITON_CACHE_MANAGER"}
    flush = 0.5
    with FaultServer(mode) as fault, inductor_config.patch(bundle_triton_into_fx_graph_cache=True):
        # Warm Inductor's lazy imports so the timing below is kcache's, then hook.
        run_bundler(src, tmp_path / "warm", keys, monkeypatch)
        assert kcache.install(
            url=fault.url, connect_timeout_s=CONNECT, read_timeout_s=READ, retries=RETRIES, flush_timeout_s=flush
        ) is True
        rt = get_runtime()
        try:
            for name in ("begin_compile", "put", "collect"):
                assert TritonBundler.__dict__[name].__func__.__module__ == "kcache.layers.inductor.triton_bundler", name
            assert TritonBundler.__dict__["read_and_emit"].__func__.__module__ == "kcache.layers.inductor.triton_bundler"

            dst = tmp_path / "dst"
            bundle, metadata, elapsed = run_bundler(src, dst, keys, monkeypatch)
            # Uploads went to the background; nothing on this thread waited on the network.
            assert elapsed < bound(0, SLACK_PROBES), f"the hooked bundler took {elapsed:.2f}s with the service down"
            assert sorted(ka.kernel_hash for ka in bundle.kernel_artifacts) == sorted(keys)
            assert metadata is not None
            assert sorted(metadata.cached_kernel_names) == sorted(k.name for k in kernels)
            for k in kernels:  # emitted locally, complete, paths pointing at the new home
                kdir = dst / k.key
                assert sorted(p.name for p in kdir.iterdir()) == sorted(k.files)
                group = json.loads((kdir / f"__grp__{k.name}.json").read_text())
                assert {Path(p) for p in group["child_paths"].values()} == {kdir / n for n in k.files if not n.startswith("__grp__")}
                assert (kdir / f"{k.name}.cubin").read_bytes() == k.files[f"{k.name}.cubin"]
            assert not [p for p in dst.iterdir() if p.name.startswith("tmp.")]
        finally:
            _, elapsed = timed(kcache.uninstall)
        assert elapsed < bound(flush, SLACK_PROBES), f"uninstall took {elapsed:.2f}s with flush_timeout_s={flush}"
    assert get_runtime() is None
    after = {n: TritonBundler.__dict__.get(n) for n in WRAPPED}
    assert all(after[n] is before[n] for n in WRAPPED), "uninstall did not restore TritonBundler"
    env_after = {k: v for k, v in os.environ.items() if k.startswith("KCACHE_") or k == "TRITON_CACHE_MANAGER"}
    assert env_after == env_before, "uninstall left kcache settings for child processes to autoload"
    assert rt is not None
    assert totals(rt) == {"hits": 0, "misses": 0, "errors": 0}  # nothing was looked up remotely
    if mode == "refuse":  # every upload is counted: failed fast, or dropped at exit
        deadline = time.monotonic() + HANG_S  # a hang guard: the loop ends with the count
        while kernel_counts(rt).put_errors < len(kernels) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rt.stats.snapshot()["kernel"].put_errors == len(kernels)


@pytest.mark.parametrize("broken", ["parts_of", "recall"])
def test_a_bug_in_recording_kernel_key_parts_never_reaches_the_compile(
    broken: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The key-parts hook runs inside Triton's compile (``get_cache_key``) and on each miss of the
    cache manager: whatever it raises is one warning, and Triton compiles the kernel as always."""
    from kcache.layers.triton import kernel_key_parts

    from kcache_testkit.corpus import compile_small

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug of ours")

    from kcache.host import failopen

    monkeypatch.setattr(failopen, "_warned", set())  # said once per process: this test's own
    monkeypatch.setattr(kernel_key_parts, broken, bug)
    with FaultServer("refuse") as dead:
        kcache.install(url=dead.url, layers="none")
        try:
            with caplog.at_level("WARNING", logger="kcache"):
                [compiled] = compile_small(tmp_path / "triton", count=1)  # the service has no copy
            assert list(compiled.glob("__grp__*.json")), list(compiled.iterdir())
        finally:
            kcache.uninstall()
    said = {"parts_of": "could not record a Triton key's parts", "recall": "could not record a kernel miss"}[broken]
    assert f"kcache: {said}: RuntimeError: a bug of ours" in caplog.text, caplog.text


def test_close_runs_the_layers_hand_overs_then_its_own_steps_each_failing_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``Runtime.close()`` is one ordered list: the steps layers registered (once each), then
    flush, publish, close, checks, report. A step that raises is one warning naming it, and the
    next step still runs; a second close does nothing. A runtime that replaces it (another
    ``install()``) keeps the installed layers' steps."""
    import logging

    from kcache.current import ensure_runtime, stop_runtime

    from kcache_testkit.ports import free_port

    config = ClientConfig(url=f"http://127.0.0.1:{free_port()}", local_dir=str(tmp_path / "a"))
    rt = ensure_runtime(config)
    done: list[str] = []

    def broken() -> None:
        done.append("broken")
        raise RuntimeError("boom")

    def handed() -> None:
        done.append("handed")

    rt.at_close("hand over a broken layer's entries", broken)
    rt.at_close("hand over a broken layer's entries", broken)  # registered once
    rt.at_close("hand over entries", handed)
    assert [name for name, _ in rt.close_steps()] == [
        "hand over a broken layer's entries", "hand over entries", "flush uploads", "publish the workload",
        "close the service connection", "check what was installed", "report stats",
    ]
    try:
        with caplog.at_level(logging.WARNING, logger="kcache"):
            replaced = ensure_runtime(ClientConfig(url=config.url, local_dir=str(tmp_path / "b")))  # closes rt
            assert replaced is not rt and done == ["broken", "handed"]
            rt.close()  # closed already: nothing runs again
            assert [name for name, _ in replaced.close_steps()][:2] == ["hand over a broken layer's entries", "hand over entries"]
            stop_runtime()
        assert done == ["broken", "handed", "broken", "handed"]
        said = [r.getMessage() for r in caplog.records if "could not hand over a broken layer's entries at exit" in r.getMessage()]
        assert len(said) == 1 and "boom" in said[0], said  # once per process (warn_once)
    finally:
        stop_runtime()
