"""Quarantine: an entry a node reported torch could not load is served to no node.

The API tests run in-process and against a real ``kcache serve`` (``api_helpers``); the store
test runs on every index backend (markers are plain index records, so the Index contract is
unchanged); the client test goes through :meth:`Runtime.quarantine` against a live service.
The end-to-end story with real torch packages is tests/test_dynamo_cache.py's.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import httpx
import pytest
from kcache_schemas import PackLimits, Producer
from kcache_schemas.models import EnvFingerprint, WorkloadManifest
from kcache_server.domain_errors import Conflict, NotFound, Quarantined, QuarantinedUpload
from kcache_server.storage import Index
from kcache_server.storage.file_blobs import FileBlobStore
from kcache_server.store import CacheStore

pytest.register_assert_rewrite("api_helpers")

from api_helpers import assert_error  # noqa: E402

pytest_plugins = ["api_helpers", "live"]

KEY = "pt2-precompile-v2:" + "ab" * 32
PAYLOAD = b"a package torch cannot load" * 10


def test_a_quarantined_entry_is_a_miss_for_every_node_and_refuses_uploads(client: httpx.Client, ns: str) -> None:
    url = f"/v1/{ns}/entries/dynamo/{KEY}"
    assert client.put(url, content=PAYLOAD).status_code == 201
    sha = hashlib.sha256(PAYLOAD).hexdigest()

    # A report about other content (a node's corrupt local copy) leaves the stored entry alone.
    other = client.post(f"{url}/quarantine", json={"reason": "TypeError: x", "sha256": "0" * 64})
    assert_error(other, 409, "conflict", "not the content reported")
    assert client.get(url).status_code == 200

    reported = client.post(f"{url}/quarantine", json={"reason": "TypeError: DefaultsSource.__init__() ...", "sha256": sha},
                           headers={"X-Kcache-Producer": "kcache/test"})
    assert reported.status_code == 201, reported.text
    body = reported.json()
    assert body["reason"].startswith("TypeError") and body["reporter"] == "kcache/test"
    assert body["entry"]["sha256"] == sha and body["entry"]["size"] == len(PAYLOAD)
    again = client.post(f"{url}/quarantine", json={"reason": "another node, same failure"})
    assert again.status_code == 200 and again.json()["reason"] == body["reason"]  # the first report stands

    err = assert_error(client.get(url), 404, "quarantined", "quarantined", "DefaultsSource")
    assert err["detail"]["reason"] == body["reason"]
    assert client.head(url).status_code == 404
    assert_error(client.get(f"{url}/info"), 404, "quarantined")
    assert client.get(f"{url}/quarantine").json() == body
    assert_error(client.put(url, content=PAYLOAD), 409, "quarantined")
    assert_error(client.put(url, content=b"a rebuilt one"), 409, "quarantined")

    assert 'kcache_quarantined_total{layer="dynamo"}' in client.get("/metrics").text  # the dashboard's counter

    # An admin lifts it (this server is open): the key takes an upload again.
    assert client.delete(f"{url}/quarantine").status_code == 204
    assert_error(client.get(f"{url}/quarantine"), 404, "not_found")
    assert_error(client.get(url), 404, "not_found")
    assert client.put(url, content=PAYLOAD).status_code == 201


def test_quarantine_needs_a_reason(client: httpx.Client, ns: str) -> None:
    url = f"/v1/{ns}/entries/dynamo/{KEY}/quarantine"
    assert_error(client.post(url, json={"reason": ""}), 422, "invalid_request")
    assert_error(client.post(url, json={"reason": "x", "sha256": "not-hex"}), 422, "invalid_request")
    # A key the service never stored: quarantined all the same (its producer would make it again).
    made = client.post(url, json={"reason": "unloadable"})
    assert made.status_code == 201 and made.json()["entry"] is None


def test_quarantine_on_every_index(index: Index, tmp_path: Path) -> None:
    store = CacheStore(FileBlobStore(tmp_path / "blobs"), index, PackLimits(), access_flush_s=60)
    try:
        info, created = store.entries.put("ns", "dynamo", KEY, PAYLOAD, Producer())
        assert created
        fp = EnvFingerprint(torch="2.13")
        manifest = WorkloadManifest(name="w", fingerprint=fp, entries=[{"layer": "dynamo", "key": KEY}, {"layer": "fx-graph", "key": "k1"}])
        store.workloads.publish("ns", "w", manifest)

        with pytest.raises(Conflict):
            store.quarantine.report("ns", "dynamo", KEY, "TypeError", sha256="1" * 64)
        q, created = store.quarantine.report("ns", "dynamo", KEY, "TypeError: boom", sha256=info.sha256, reporter="kcache/x")
        assert created and q.entry == info
        assert store.quarantine.report("ns", "dynamo", KEY, "later")[1] is False
        with pytest.raises(Quarantined, match="boom"):
            store.entries.read("ns", "dynamo", KEY)
        with pytest.raises(QuarantinedUpload):
            store.entries.put("ns", "dynamo", KEY, PAYLOAD, Producer())
        assert store.quarantine.info("ns", "dynamo", KEY) == q
        assert store.quarantine.quarantined_keys("ns", "dynamo", [KEY, "other"]) == {KEY}
        # The blob is gone with the entry; the marker holds none and is no cache item (no budget, no GC).
        assert store.blobs.size(info.sha256) is None
        kinds = store.records.kinds("ns")
        assert kinds["quarantine/dynamo"].entries == 1 and kinds["quarantine/dynamo"].bytes == 0
        assert "entry/dynamo" not in kinds or kinds["entry/dynamo"].entries == 0
        # The workload's next prefetch does not list it.
        view = store.workloads.view("ns", "w")
        assert [(e.layer, e.key) for e in view.entries] == [("fx-graph", "k1")]

        store.quarantine.lift("ns", "dynamo", KEY)
        with pytest.raises(NotFound):
            store.quarantine.lift("ns", "dynamo", KEY)
        assert store.entries.put("ns", "dynamo", KEY, PAYLOAD, Producer())[1]
    finally:
        store.access.close()


def test_runtime_quarantine_reports_what_it_handed_over(live_service, tmp_path: Path) -> None:
    """:meth:`Runtime.quarantine`, for any layer's caller: dropped locally, counted, said once,
    reported with the sha256 of the stored bytes it handed over; never served or uploaded again."""
    from kcache.config import ClientConfig
    from kcache.runtime import Runtime

    config = ClientConfig.from_env(url=live_service.url, local_dir=str(tmp_path / "local"), mode="readwrite")
    producer = Runtime(config)
    producer.put_entry("fx-graph", "pt2:fx-graph-v1::k:c1", PAYLOAD, now=True)
    producer.close()

    rt = Runtime(config)
    try:
        assert rt.get_entry("fx-graph", "pt2:fx-graph-v1::k:c1") == PAYLOAD
        # The local tier's copy (written in the background on a remote hit) is what gets hashed.
        for _ in range(100):
            if rt.local.get("fx-graph", "pt2:fx-graph-v1::k:c1") is not None:
                break
            time.sleep(0.02)
        rt.quarantine("fx-graph", "pt2:fx-graph-v1::k:c1", "EOFError: Ran out of input")
        assert rt.local.get("fx-graph", "pt2:fx-graph-v1::k:c1") is None
        info = rt.client.quarantine_info("fx-graph", "pt2:fx-graph-v1::k:c1")  # type: ignore[union-attr]
        assert info.reason == "EOFError: Ran out of input" and info.entry is not None
        assert info.entry.sha256 == hashlib.sha256(PAYLOAD).hexdigest()
        assert rt.get_entry("fx-graph", "pt2:fx-graph-v1::k:c1") is None
        rt.put_entry("fx-graph", "pt2:fx-graph-v1::k:c1", PAYLOAD)
        assert rt.uploader is not None and rt.uploader.flush(10)
        counts = rt.stats.snapshot()["fx-graph"]
        assert counts.error_kinds == {"quarantined": 1} and counts.miss_reasons == {"quarantined": 1} and counts.puts == 0
        doc = rt.stats.document()
        assert doc.verification == {"quarantined": {"fx-graph: EOFError: Ran out of input": 1}}
        assert ("fx-graph", "pt2:fx-graph-v1::k:c1") not in rt.used_entries  # not in the workload's next prefetch
    finally:
        rt.close()

    other = Runtime(config)  # another node: a miss told apart from a cold one
    try:
        assert other.get_entry("fx-graph", "pt2:fx-graph-v1::k:c1") is None
        assert other.stats.snapshot()["fx-graph"].miss_reasons == {"quarantined": 1}
    finally:
        other.close()


def test_a_damaged_service_copy_is_quarantined_a_damaged_local_one_only_dropped(live_service, tmp_path: Path) -> None:
    """``get_entry(..., quarantine_invalid=True)`` (the ``jit`` layer's, whose check is the
    content's own sizes and sha256): a copy the service sends that ``validate`` refuses is
    quarantined with the sha256 of those bytes; a refused local copy is dropped and the service's
    whole copy served, nothing quarantined."""
    from kcache.config import ClientConfig
    from kcache.runtime import Runtime

    def validate(data: bytes) -> None:
        if not data.startswith(b"whole"):
            raise ValueError("size or sha256 does not match")

    def runtime(name: str) -> Runtime:
        return Runtime(ClientConfig.from_env(url=live_service.url, local_dir=str(tmp_path / name), mode="readwrite"))

    whole, damaged = "jit-test:whole", "jit-test:damaged"
    producer = runtime("producer")
    producer.put_entry("jit", whole, b"whole bytes", now=True)
    producer.put_entry("jit", damaged, b"flipped bytes", now=True)
    producer.close()

    rt = runtime("node")
    try:
        rt.local.put("jit", whole, b"flipped on this node's disk")
        assert rt.get_entry("jit", whole, validate=validate, quarantine_invalid=True) == b"whole bytes"
        assert rt.get_entry("jit", damaged, validate=validate, quarantine_invalid=True) is None
        counts = rt.stats.snapshot()["jit"]
        assert counts.hits == 1 and counts.error_kinds == {"invalid_entry": 2, "quarantined": 1}
        assert rt.client is not None
        info = rt.client.quarantine_info("jit", damaged)
        assert info.reason.startswith("damaged: size or sha256") and info.entry is not None
        assert info.entry.sha256 == hashlib.sha256(b"flipped bytes").hexdigest()
        with pytest.raises(Exception, match="quarantined"):
            rt.client.get_entry("jit", damaged)  # no node receives it
        assert rt.client.get_entry("jit", whole)[0] == b"whole bytes"  # one node's disk took nothing out of service
    finally:
        rt.close()


def test_inspect_shows_a_quarantined_entry(live_service, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kcache.cli.commands import main
    from kcache.config import ClientConfig
    from kcache.transport.http import KcacheClient

    client = KcacheClient(ClientConfig(url=live_service.url))
    client.put_entry("dynamo", KEY, PAYLOAD)
    client.quarantine("dynamo", KEY, "TypeError: DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were given")
    assert main(["inspect", "--url", live_service.url, "--entry", "dynamo", KEY]) == 1
    out = capsys.readouterr().out
    assert "QUARANTINED" in out and "DefaultsSource" in out and f"sha256 {hashlib.sha256(PAYLOAD).hexdigest()}" in out
    assert main(["inspect", "--url", live_service.url, "--entry", "dynamo", KEY, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["quarantine"]["reason"].startswith("TypeError") and doc["accepted"] is False
