"""The workload prefetch runs off the compile path, under deadlines of its own (issue #25).

A loaded service (a CI machine at load 12 on 2 cores) took longer than the client's 2 s read
deadline to merge a workload's manifest; the prefetch, which asked for it under that on-path
deadline, failed with ``kcache: workload prefetch failed: ... ReadTimeout`` in the job's stderr.
The manifest now has ``KCACHE_PREFETCH_TIMEOUT_S``, and a compile that needs it meanwhile still
waits no longer than for an answer of its own, then goes to the service.

Real: the service (uvicorn on loopback), the client's ``Runtime`` and its prefetcher; between
them a small proxy (``netfaults.FaultServer`` in ``http`` mode) that holds the workload's view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from kcache.config import ClientConfig
from kcache.host.process_roles import PREFETCH_OWNER_ENV
from kcache.runtime import Runtime
from kcache.transport.http import KcacheClient
from kcache.transport.workload import publish
from kcache_schemas import wire

from kcache_testkit.netfaults import FaultServer, Request, http_response
from kcache_testkit.pace import HANG_S

pytest_plugins = ["live"]

WORKLOAD = "slow-manifest"
LAYER = "fx-graph"
PROMISED = "pt2:fx-graph-v1::prefetch-deadlines:c1"
ABSENT = "pt2:fx-graph-v1::prefetch-deadlines-absent:c1"
DATA = b"an fx-graph entry the workload promises " * 100
# The compile path's deadlines: the read deadline above the 2 s default, as the prefetch's
# download of the promised entry keeps it and a loaded machine's service answered slower.
CONNECT_S, READ_S = 0.5, 4.0
# The proxy holds the view at least this long after it arrived, so the on-path read deadline
# (which started before) would have fired whatever the machine's load.
HOLD_S = READ_S + 0.5
# KCACHE_PREFETCH_WAIT_S here: far above the on-path deadline, so a compile that waited for the
# held manifest by this bound (not by the on-path one) is told apart from one that did not.
WAIT_S = 120.0
_HOP = {"host", "content-length", "connection", "transfer-encoding", "content-encoding"}


@dataclass
class Proxy:
    """Forwards to the real service; holds the workload's view until ``release`` (and ``HOLD_S``)."""

    server: FaultServer
    view_asked: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)


@pytest.fixture
def proxy(live_service) -> Iterator[Proxy]:  # type: ignore[no-untyped-def]
    view_path = wire.path(wire.WORKLOAD, namespace="default", name=WORKLOAD)
    upstream = httpx.Client(base_url=live_service.url, timeout=HANG_S)  # the proxy's own hop: a hang guard
    with FaultServer("refuse") as server:
        p = Proxy(server)

        def forward(req: Request) -> bytes:
            path = unquote(req.path.split("?")[0])
            p.paths.append(path)
            if path == view_path:
                received = time.monotonic()
                p.view_asked.set()
                p.release.wait(HANG_S)
                time.sleep(max(0.0, received + HOLD_S - time.monotonic()))
            headers = {k: v for k, v in req.headers.items() if k not in _HOP}
            r = upstream.request(req.method, req.path, headers=headers, content=req.body)
            return http_response(r.status_code, r.content, {k: v for k, v in r.headers.items() if k.lower() not in _HOP})

        server.set_mode("http", handler=forward)
        try:
            yield p
        finally:
            p.release.set()  # let a held request end before the server closes
    upstream.close()


def test_a_slow_manifest_delays_the_prefetch_and_never_the_compile(live_service, proxy: Proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Before: the view was asked for under the 2 s read deadline, failed (``kcache: workload
    prefetch failed: ... ReadTimeout``) and nothing was prefetched. Now it arrives late and the
    prefetch goes on; a compile meanwhile waited for it only as long as for its own request."""
    writer = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))  # the test's own calls: a hang guard
    writer.put_entry(LAYER, PROMISED, DATA)
    publish(writer, WORKLOAD, set(), {(LAYER, PROMISED)})
    monkeypatch.delenv(PREFETCH_OWNER_ENV, raising=False)  # this process may prefetch

    config = ClientConfig(url=proxy.server.url, mode="readonly", workload=WORKLOAD, local_dir=str(tmp_path / "local"),
                          connect_timeout_s=CONNECT_S, read_timeout_s=READ_S, prefetch_wait_s=WAIT_S, prefetch_timeout_s=HANG_S)
    with caplog.at_level("WARNING", logger="kcache"):
        rt = Runtime(config)
        try:
            prefetcher = rt.prefetcher
            assert prefetcher is not None
            assert proxy.view_asked.wait(HANG_S)

            # A compile while the manifest is held: it goes to the service (a miss) without
            # waiting for the manifest, which is still outstanding when the lookup returns.
            started = time.monotonic()
            assert rt.get_entry(LAYER, ABSENT) is None
            waited = time.monotonic() - started
            assert not prefetcher.manifest_ready.is_set()
            assert waited < WAIT_S, f"the compile waited {waited:.1f} s for the prefetch's manifest"
            counts = rt.stats.snapshot()[LAYER]
            assert counts.hits == 0 and counts.misses + counts.errors == 1, counts

            # The manifest arrives after longer than the on-path read deadline: the prefetch
            # goes on and brings the promised entry; a compile then finds it in the local tier.
            proxy.release.set()
            assert prefetcher.done.wait(HANG_S)
            assert prefetcher.view is not None and prefetcher.view.runs == 1
            assert prefetcher.counts["entries"] == 1, prefetcher.counts
            assert rt.get_entry(LAYER, PROMISED) == DATA
        finally:
            rt.close()
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("kcache:")] == []
    view_path = wire.path(wire.WORKLOAD, namespace="default", name=WORKLOAD)
    entry_path = wire.path(wire.ENTRY, namespace="default", layer=LAYER, key=PROMISED)
    assert proxy.paths.count(view_path) == 1 and proxy.paths.count(entry_path) == 1  # the tier served the compile


def test_the_manifest_deadline_is_a_setting_longer_than_the_read_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ClientConfig().prefetch_timeout_s > ClientConfig().read_timeout_s
    monkeypatch.setenv("KCACHE_PREFETCH_TIMEOUT_S", "2m")
    assert ClientConfig.from_env().prefetch_timeout_s == 120.0
    monkeypatch.setenv("KCACHE_PREFETCH_TIMEOUT_S", "0")
    with pytest.raises(ValueError, match="KCACHE_PREFETCH_TIMEOUT_S='0': must be above 0s"):
        ClientConfig.from_env()
