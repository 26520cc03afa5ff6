"""How a prefetch's bytes travel at fleet scale (issue #31): from the object store when the
service hands out presigned URLs, and a batch-get that loses its connection halfway is retried
for the packs that did not arrive.

Real HTTP servers on loopback (``netfaults.FaultServer`` in ``http`` mode): one answers as the
service does with ``KCACHE_PRESIGNED_DOWNLOADS=true`` (a workload view saying
``X-Kcache-Downloads: presigned``, ``kernels:batch-urls``, ``entries:batch-urls`` or (as a service
older than it) a 307 per entry, ``kernels:batch-get`` for what has no URL), the other as the
object store. The client's real prefetch
(``kcache.transport.workload.pull_workload``) must take each pack from its URL, fall back to one batch-get
for the keys without a URL and the URL that failed, follow the entry's redirect keeping the
producer's compile time, never send its bearer token to the store, and never fetch a URL for a
key it did not ask for. The real service and S3 are in tests/test_replicas.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kcache.config import ClientConfig
from kcache.store.fingerprint import current
from kcache.store.local_store import LocalEntryStore
from kcache.transport.http import KcacheClient
from kcache.transport.workload import fetch_view, pull_workload
from kcache_schemas import wire

from kcache_testkit.kernels import Kernel, large_pack, real_kernels
from kcache_testkit.netfaults import FaultServer, Request, http_response, tar_stream

NS = "presigned"
WORKLOAD = "presigned-job"
TOKEN = "bearer-token-0123456789abcdef"
ENTRY = ("fx-graph", "entry-1")
ENTRY_BYTES = b"an fx-graph entry " * 1000


@dataclass
class Servers:
    service: FaultServer
    store: FaultServer
    kernels: list[Kernel]
    presigned: bool = True
    # What entries:batch-urls answers: None, the route is unknown (a service older than it, 404);
    # else the object-store path the entry's URL names.
    entry_url_path: str | None = None
    seen: list[Request] = field(default_factory=list)  # every request, both servers
    lock: threading.Lock = field(default_factory=threading.Lock)

    def asked(self, server: FaultServer, method: str, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.seen if r.path.split("?")[0] == path and r.method == method and getattr(r, "server", None) is server]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> list[Kernel]:
    return real_kernels(tmp_path_factory.mktemp("triton"), count=3)


@pytest.fixture
def servers(kernels: list[Kernel]) -> Iterator[Servers]:
    """k0 has a URL, k1's URL fails (500), k2 has none (``inline``); one entry behind a 307."""
    with FaultServer("refuse") as service, FaultServer("refuse") as store:
        s = Servers(service, store, kernels)
        by_key = {k.key: k.pack for k in kernels}
        k0, k1, k2 = (k.key for k in kernels)

        def note(server: FaultServer, req: Request) -> None:
            req.server = server  # type: ignore[attr-defined]
            with s.lock:
                s.seen.append(req)

        def serve_service(req: Request) -> bytes:
            note(service, req)
            path = req.path.split("?")[0]
            if path == wire.path(wire.WORKLOAD, namespace=NS, name=WORKLOAD):
                view = {"name": WORKLOAD, "fingerprint": current().model_dump(), "kernels": [k0, k1, k2],
                        "entries": [{"layer": ENTRY[0], "key": ENTRY[1]}], "runs": 1}
                headers = {"Content-Type": "application/json"}
                if s.presigned:
                    headers[wire.DOWNLOADS] = wire.DOWNLOADS_PRESIGNED
                return http_response(200, json.dumps(view).encode(), headers)
            if path == wire.path(wire.KERNELS_BATCH_URLS, namespace=NS):
                urls = {k0: f"{store.url}/o/{k0}?X-Amz-Signature=s", k1: f"{store.url}/o/broken?X-Amz-Signature=s",
                        # a URL for a key nobody asked for: never fetched
                        "ZZZZ" * 13: f"{store.url}/o/unasked"}
                body = {"urls": urls, "inline": [k2], "missing": [], "invalid": [], "expires_s": 300}
                return http_response(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
            if path == wire.path(wire.KERNELS_BATCH_GET, namespace=NS):
                keys = json.loads(req.body)["keys"]
                index = {"found": keys, "missing": [], "invalid": []}
                members = [(wire.BATCH_INDEX, json.dumps(index).encode())] + [(wire.batch_member(k), by_key[k]) for k in keys]
                return http_response(200, tar_stream(members), {"Content-Type": "application/x-tar"})
            if path == wire.path(wire.ENTRIES_BATCH_URLS, namespace=NS) and s.entry_url_path is not None:
                asked_for = json.loads(req.body)["entries"]
                entry_url = {"layer": ENTRY[0], "key": ENTRY[1], "url": f"{store.url}{s.entry_url_path}?X-Amz-Signature=s",
                             "sha256": hashlib.sha256(ENTRY_BYTES).hexdigest(), "compile_time_s": 2.5}
                unasked = {"layer": "autotune", "key": "never-asked", "url": f"{store.url}/o/unasked", "sha256": "0" * 64}
                body = {"urls": [entry_url, unasked], "missing": [e for e in asked_for if e["key"] != ENTRY[1]], "expires_s": 300}
                return http_response(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
            if path == wire.path(wire.ENTRY, namespace=NS, layer=ENTRY[0], key=ENTRY[1]):
                return http_response(307, b"", {"Location": f"{store.url}/o/entry?X-Amz-Signature=s", wire.COMPILE_TIME: "2.500"})
            return http_response(404, b"")

        def serve_store(req: Request) -> bytes:
            note(store, req)
            path = req.path.split("?")[0]
            if path == "/o/broken":
                return http_response(500, b"<Error><Code>InternalError</Code></Error>")
            if path == "/o/entry":
                return http_response(200, ENTRY_BYTES, {"Content-Type": "application/octet-stream"})
            if path == "/o/other-bytes":  # an object that is not what the service listed
                return http_response(200, b"not the entry", {"Content-Type": "application/octet-stream"})
            name = path.removeprefix("/o/")
            if name in by_key:
                return http_response(200, by_key[name], {"Content-Type": "application/octet-stream"})
            return http_response(404, b"")

        service.set_mode("http", handler=serve_service)
        store.set_mode("http", handler=serve_store)
        yield s


def _client(s: Servers) -> KcacheClient:
    return KcacheClient(ClientConfig(url=s.service.url, namespace=NS, token=TOKEN))


def test_prefetch_takes_packs_and_entries_from_the_object_store(servers: Servers, tmp_path: Path) -> None:
    client = _client(servers)
    local = LocalEntryStore(tmp_path, NS, url=servers.service.url)
    view = fetch_view(client, WORKLOAD)
    assert view is not None and client.presigned_downloads

    counts = pull_workload(client, view, local)

    assert counts["kernels"] == 3 and counts["entries"] == 1 and counts["refused"] == 0
    for k in servers.kernels:
        assert local.get("kernel", k.key) == k.pack
    assert local.get(*ENTRY) == ENTRY_BYTES
    k0, k1, k2 = (k.key for k in servers.kernels)
    # Through the service: only what had no URL (k2) and the URL that failed (k1), in one batch-get.
    batch = servers.asked(servers.service, "POST", wire.path(wire.KERNELS_BATCH_GET, namespace=NS))
    assert [json.loads(r.body)["keys"] for r in batch] == [[k2, k1]]
    # From the store: k0, k1's broken URL (tried twice: one retry after a 5xx), the entry; never
    # the URL of a key the client did not ask for, and never with the service's token.
    store_paths = sorted(r.path.split("?")[0] for r in servers.seen if getattr(r, "server", None) is servers.store)
    assert store_paths == sorted([f"/o/{k0}", "/o/broken", "/o/broken", "/o/entry"])
    assert all("authorization" not in r.headers for r in servers.seen if getattr(r, "server", None) is servers.store)
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in servers.seen if getattr(r, "server", None) is servers.service)
    # The producer's compile time rides on the redirect (the store's answer lacks it).
    assert client.get_entry(*ENTRY) == (ENTRY_BYTES, 2.5)


@pytest.mark.parametrize("object_path", ["/o/entry", "/o/other-bytes"])
def test_entries_come_by_one_url_list_and_are_checked(servers: Servers, tmp_path: Path, object_path: str) -> None:
    """A service with entries:batch-urls: one request for the prefetch's entries instead of a
    redirected GET each (before: one API request per entry, 19 of a node start's 28). The bytes
    are checked against the listed sha256: an object that is not the entry is not kept, and the
    entry comes by its GET instead."""
    servers.entry_url_path = object_path
    client = _client(servers)
    local = LocalEntryStore(tmp_path, NS, url=servers.service.url)
    view = fetch_view(client, WORKLOAD)
    assert view is not None

    counts = pull_workload(client, view, local)

    assert counts["entries"] == 1 and local.get(*ENTRY) == ENTRY_BYTES
    url_lists = servers.asked(servers.service, "POST", wire.path(wire.ENTRIES_BATCH_URLS, namespace=NS))
    assert [json.loads(r.body) for r in url_lists] == [{"entries": [{"layer": ENTRY[0], "key": ENTRY[1]}]}]
    entry_gets = servers.asked(servers.service, "GET", wire.path(wire.ENTRY, namespace=NS, layer=ENTRY[0], key=ENTRY[1]))
    assert len(entry_gets) == (0 if object_path == "/o/entry" else 1)
    store_paths = [r.path.split("?")[0] for r in servers.seen if getattr(r, "server", None) is servers.store]
    assert "/o/unasked" not in store_paths and store_paths.count(object_path) == 1
    assert all("authorization" not in r.headers for r in servers.seen if getattr(r, "server", None) is servers.store)


def test_without_the_header_packs_come_through_batch_get(servers: Servers, tmp_path: Path) -> None:
    servers.presigned = False
    client = _client(servers)
    view = fetch_view(client, WORKLOAD)
    assert view is not None and not client.presigned_downloads
    counts = pull_workload(client, view, LocalEntryStore(tmp_path, NS, url=servers.service.url))
    assert counts["kernels"] == 3
    assert not servers.asked(servers.service, "POST", wire.path(wire.KERNELS_BATCH_URLS, namespace=NS))
    batch = servers.asked(servers.service, "POST", wire.path(wire.KERNELS_BATCH_GET, namespace=NS))
    assert [json.loads(r.body)["keys"] for r in batch] == [[k.key for k in servers.kernels]]


@pytest.mark.parametrize("cut", ["before the answer", "halfway", "a clean end inside a pack"])
def test_a_batch_get_that_loses_its_connection_is_retried_for_what_did_not_arrive(kernels: list[Kernel], cut: str) -> None:
    """A connection dropped before the answer (a keep-alive connection the service closed as it
    was reused) or halfway (a replica restarting, its object-store read failing mid-stream):
    before, the whole batch was lost and the node compiled every kernel in it. A whole HTTP
    answer whose tar ends inside a pack (seen on H200 nodes: ``malformed stream: unexpected end
    of data`` after 77 packs) was not retried until issue #26's seventh session."""
    # The second pack large (2 MiB of random .cubin): the client reads ahead of what it parsed,
    # so the cut falls inside it, well after the first pack arrived.
    by_key = {k.key: (large_pack(k, 2 << 20) if i == 1 else k.pack) for i, k in enumerate(kernels)}
    asked: list[list[str]] = []

    def serve(req: Request) -> bytes:
        keys = json.loads(req.body)["keys"]
        asked.append(keys)
        index = {"found": keys, "missing": [], "invalid": []}
        body = tar_stream([(wire.BATCH_INDEX, json.dumps(index).encode())] + [(wire.batch_member(k), by_key[k]) for k in keys])
        if len(asked) > 1:
            return http_response(200, body, {"Content-Type": "application/x-tar"})
        if cut == "before the answer":
            return b""
        # The first pack whole, the second begun: the connection closes short of its length.
        end = body.index(wire.batch_member(keys[1]).encode()) + (1 << 20)
        if cut == "a clean end inside a pack":  # the HTTP answer whole (its length says so), the tar not
            return http_response(200, body[:end], {"Content-Type": "application/x-tar"})
        return http_response(200, body, {"Content-Type": "application/x-tar"})[:end]

    with FaultServer("http", handler=serve) as server:
        client = KcacheClient(ClientConfig(url=server.url, namespace=NS))
        got = dict(client.batch_get(list(by_key)))
    assert got == by_key
    keys = list(by_key)
    assert asked == [keys, keys if cut == "before the answer" else keys[1:]]
