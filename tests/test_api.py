"""The REST API, every test run both in-process and against a real `kcache serve` on loopback."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import httpx
import pytest
from kcache_schemas import build_pack, read_pack
from kcache_schemas.pack import MEDIA_TYPE, manifest_for_files, substitute_dir

from kcache_testkit.kernels import Kernel

pytest.register_assert_rewrite("api_helpers")

from api_helpers import assert_error  # noqa: E402

pytest_plugins = ["api_helpers"]


def _put(client: httpx.Client, ns: str, key: str, pack: bytes) -> httpx.Response:
    return client.put(f"/v1/{ns}/kernels/{key}", content=pack, headers={"Content-Type": MEDIA_TYPE})


def _changed_ptx(k: Kernel) -> bytes:
    """Different content for the same key: the key check is against <name>.json's hash."""
    files = dict(k.files)
    files[f"{k.name}.ptx"] = files[f"{k.name}.ptx"] + b"\n// recompiled elsewhere\n"
    return build_pack(manifest_for_files(k.key, files), files)


def test_put_get_roundtrip(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    resp = _put(client, ns, kernel.key, kernel.pack)
    assert resp.status_code == 201, resp.text
    entry = resp.json()
    assert entry["key"] == kernel.key and entry["namespace"] == ns
    assert entry["pack_size"] == len(kernel.pack)
    assert entry["total_size"] == kernel.manifest.total_size
    assert entry["content_digest"] == kernel.manifest.content_digest

    got = client.get(f"/v1/{ns}/kernels/{kernel.key}")
    assert got.status_code == 200
    assert got.headers["content-type"].startswith(MEDIA_TYPE)
    assert got.content == kernel.pack
    assert got.headers["etag"] == f'"{kernel.manifest.content_digest}"'
    assert got.headers["x-kcache-target"] == "cuda:90:32"
    manifest, files = read_pack(got.content)
    assert manifest.key == kernel.key and files == kernel.files


def test_write_once(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201
    again = _put(client, ns, kernel.key, kernel.pack)
    assert again.status_code == 200, again.text
    assert again.json()["key"] == kernel.key

    conflict = _put(client, ns, kernel.key, _changed_ptx(kernel))
    assert_error(conflict, 409, "conflict", kernel.key, "write-once")
    # The first upload is what stays.
    assert client.get(f"/v1/{ns}/kernels/{kernel.key}").content == kernel.pack
    ptx = client.get(f"/v1/{ns}/kernels/{kernel.key}/files/{kernel.name}.ptx")
    assert ptx.content == kernel.files[f"{kernel.name}.ptx"]


def test_same_content_other_compression_is_not_a_conflict(
    client: httpx.Client, ns: str, kernel: Kernel
) -> None:
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201
    repacked = build_pack(kernel.manifest, kernel.files, level=19)
    assert repacked != kernel.pack
    assert _put(client, ns, kernel.key, repacked).status_code == 200


def test_namespaces_are_separate(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201
    other = ns + "-other"
    assert client.head(f"/v1/{other}/kernels/{kernel.key}").status_code == 404
    # A different kernel dir for the same key in another namespace is no conflict.
    assert _put(client, other, kernel.key, _changed_ptx(kernel)).status_code == 201


def test_head(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    url = f"/v1/{ns}/kernels/{kernel.key}"
    absent = client.head(url)
    assert absent.status_code == 404
    assert absent.content == b""
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201
    present = client.head(url)
    assert present.status_code == 200
    assert int(present.headers["content-length"]) == len(kernel.pack)
    assert present.headers["x-kcache-total-size"] == str(kernel.manifest.total_size)
    assert present.content == b""


def test_manifest(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    assert_error(client.get(f"/v1/{ns}/kernels/{kernel.key}/manifest"), 404, "not_found", kernel.key)
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201
    resp = client.get(f"/v1/{ns}/kernels/{kernel.key}/manifest")
    assert resp.status_code == 200
    m = resp.json()
    assert m["key"] == kernel.key and m["kernel_name"] == kernel.name
    assert m["target"] == {"device_type": "cuda", "arch": "90", "warp_size": 32}
    import triton

    assert m["triton_version"] == triton.__version__
    assert {f["name"]: (f["size"], f["sha256"]) for f in m["files"]} == {
        f.name: (f.size, f.sha256) for f in kernel.manifest.files
    }
    assert m["total_size"] == sum(len(b) for b in kernel.files.values())


def test_get_single_files(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201
    base = f"/v1/{ns}/kernels/{kernel.key}/files"
    ptx = client.get(f"{base}/{kernel.name}.ptx")
    assert ptx.status_code == 200
    assert ptx.content == kernel.files[f"{kernel.name}.ptx"]
    assert ptx.headers["content-type"].startswith("text/plain")
    assert b".target sm_90" in ptx.content
    cubin = client.get(f"{base}/{kernel.name}.cubin")
    assert cubin.content == kernel.files[f"{kernel.name}.cubin"]
    assert cubin.content[:4] == b"\x7fELF"
    assert cubin.headers["content-type"] == "application/octet-stream"
    grp = client.get(f"{base}/__grp__{kernel.name}.json")
    assert grp.headers["content-type"].startswith("application/json")
    assert b"[REPLACE]/" in grp.content
    assert_error(client.get(f"{base}/{kernel.name}.hsaco"), 404, "not_found", f"{kernel.name}.hsaco")
    assert_error(client.get(f"{base}/.hidden"), 400, "invalid_key", "file name")


def test_hex_key_form(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    # Upload under the hex form, read under both forms.
    resp = _put(client, ns, kernel.hex_key, kernel.pack)
    assert resp.status_code == 201, resp.text
    assert resp.json()["key"] == kernel.key
    for key in (kernel.hex_key, kernel.hex_key.upper(), kernel.key):
        got = client.get(f"/v1/{ns}/kernels/{key}")
        assert got.status_code == 200 and got.content == kernel.pack
        assert client.head(f"/v1/{ns}/kernels/{key}").status_code == 200
    manifest = client.get(f"/v1/{ns}/kernels/{kernel.hex_key}/manifest").json()
    assert manifest["key"] == kernel.key
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 200


def test_missing(client: httpx.Client, ns: str, kernels: list[Kernel]) -> None:
    stored, absent = kernels[:2], kernels[2:]
    for k in stored:
        assert _put(client, ns, k.key, k.pack).status_code == 201
    keys = [k.key for k in kernels] + [absent[0].hex_key, "not-a-key"]
    resp = client.post(f"/v1/{ns}/kernels:missing", json={"keys": keys})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body["missing"]) == {k.key for k in absent}
    assert body["invalid"] == ["not-a-key"]
    empty = client.post(f"/v1/{ns}/kernels:missing", json={"keys": []})
    assert empty.json() == {"missing": [], "invalid": []}


def test_batch_get(client: httpx.Client, ns: str, kernels: list[Kernel]) -> None:
    stored = kernels[:3]
    for k in stored:
        assert _put(client, ns, k.key, k.pack).status_code == 201
    absent = kernels[3]
    keys = [stored[2].key, absent.key, stored[0].hex_key, stored[1].key, "junk"]
    with client.stream("POST", f"/v1/{ns}/kernels:batch-get", json={"keys": keys}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("application/x-tar")
        raw = b"".join(resp.iter_bytes())
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tf:
        members = []
        for m in tf:
            fh = tf.extractfile(m)
            assert fh is not None
            members.append((m.name, fh.read()))
    assert members[0][0] == "index.json"
    index = json.loads(members[0][1])
    expected_found = [stored[2].key, stored[0].key, stored[1].key]
    assert index == {"found": expected_found, "missing": [absent.key], "invalid": ["junk"]}
    by_key = {k.key: k for k in kernels}
    assert [n for n, _ in members[1:]] == [f"{k}.kpack" for k in expected_found]
    for name, data in members[1:]:
        assert data == by_key[name.removesuffix(".kpack")].pack

    bad = client.post(f"/v1/{ns}/kernels:batch-get", json={"keys": []})
    assert_error(bad, 422, "invalid_request", "keys")


def test_a_batch_get_stream_stopped_before_its_end_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A node saw a batch-get's tar end inside a pack while the service logged nothing (issue
    #26, H200): a stream the service stops making (the client went away, a read failed) now
    says where it stopped; a whole one says nothing."""
    from kcache_server.responses import tar_stream
    from kcache_server.storage import BlobStream

    packs = [(f"{i}.kpack", bytes([i]) * (300 << 10)) for i in range(3)]  # each past a batch chunk
    with caplog.at_level(logging.WARNING, logger="kcache_server.responses"):
        whole = b"".join(tar_stream(("index.json", b"{}"), ((n, BlobStream.of(d)) for n, d in packs)))
        assert not caplog.records
        with tarfile.open(fileobj=io.BytesIO(whole), mode="r|") as tf:
            assert [m.name for m in tf] == ["index.json"] + [n for n, _ in packs]

        stream = tar_stream(("index.json", b"{}"), ((n, BlobStream.of(d)) for n, d in packs))
        next(stream), next(stream)  # the client reads a little, then leaves
        stream.close()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["a streamed tar stopped after 1 members"]


def test_listing_pagination(client: httpx.Client, ns: str, kernels: list[Kernel]) -> None:
    assert client.get(f"/v1/{ns}/kernels").json() == {"items": [], "next_cursor": None}
    for k in kernels:
        assert _put(client, ns, k.key, k.pack).status_code == 201
    seen: list[str] = []
    cursor: str | None = ""
    pages = 0
    while cursor is not None:
        resp = client.get(f"/v1/{ns}/kernels", params={"limit": 2, "cursor": cursor})
        assert resp.status_code == 200, resp.text
        page = resp.json()
        assert len(page["items"]) <= 2
        seen += [item["key"] for item in page["items"]]
        cursor = page["next_cursor"]
        pages += 1
        assert pages <= len(kernels)
    assert seen == sorted(k.key for k in kernels)
    assert pages == 3  # 2 + 2 + 1
    full = client.get(f"/v1/{ns}/kernels", params={"limit": 5}).json()
    assert len(full["items"]) == 5 and full["next_cursor"] is None
    item = full["items"][0]
    assert item["target"]["arch"] == "90" and item["pack_size"] > 0
    first = sorted(k.key for k in kernels)[0]
    by_prefix = client.get(f"/v1/{ns}/kernels", params={"prefix": first[:6]}).json()
    assert [i["key"] for i in by_prefix["items"]] == [first]
    assert_error(client.get(f"/v1/{ns}/kernels", params={"limit": 0}), 422, "invalid_request", "limit")


def test_delete_on_open_server(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    url = f"/v1/{ns}/kernels/{kernel.key}"
    assert_error(client.delete(url), 404, "not_found")
    assert _put(client, ns, kernel.key, kernel.pack).status_code == 201
    assert client.delete(url).status_code == 204
    assert client.head(url).status_code == 404
    assert _put(client, ns, kernel.key, _changed_ptx(kernel)).status_code == 201


def test_entries_write_once(client: httpx.Client, ns: str) -> None:
    key = "pt2:fx-graph-v1::fabcdef0123456789:c1"
    url = f"/v1/{ns}/entries/fx-graph/{key}"
    payload = bytes(range(256)) * 40  # opaque (FX-graph entries are pickles; never parsed)
    assert client.head(url).status_code == 404
    assert_error(client.get(url), 404, "not_found", key)

    put = client.put(url, content=payload, headers={"X-Kcache-Compile-Time": "12.5"})
    assert put.status_code == 201, put.text
    info = put.json()
    assert info["layer"] == "fx-graph" and info["key"] == key and info["size"] == len(payload)
    assert info["producer"]["compile_time_s"] == 12.5

    assert client.put(url, content=payload).status_code == 200
    assert_error(client.put(url, content=payload + b"x"), 409, "conflict", "write-once")

    got = client.get(url)
    assert got.status_code == 200 and got.content == payload
    assert got.headers["x-kcache-compile-time"] == "12.500"
    head = client.head(url)
    assert head.status_code == 200
    assert int(head.headers["content-length"]) == len(payload)
    # Layers are separate key spaces.
    assert client.head(f"/v1/{ns}/entries/autotune/{key}").status_code == 404
    assert client.get(f"{url}/info").json()["sha256"] == info["sha256"]


def test_health_and_docs(client: httpx.Client) -> None:
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"blobs": "ok", "index": "ok"}}
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    spec = client.get("/openapi.json")
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    for p in (
        "/v1/{namespace}/kernels/{key}",
        "/v1/{namespace}/kernels:missing",
        "/v1/{namespace}/kernels:batch-get",
        "/v1/{namespace}/kernels",
        "/v1/{namespace}/entries/{layer}/{key}",
    ):
        assert p in paths, sorted(paths)
    unknown = client.get("/no/such/route")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"


# ---- what Inductor actually ships: TritonBundler.collect payloads --------------------------------


@pytest.mark.torch
def test_triton_bundler_payloads_upload_and_come_back_byte_for_byte(
    client: httpx.Client,
    ns: str,
    kernels: list[Kernel],
    bundler_artifacts: dict[str, dict[str, bytes]],
) -> None:
    assert len(bundler_artifacts) == 2
    by_key = {k.key: k for k in kernels}
    for key, payloads in bundler_artifacts.items():
        assert any(b"[REPLACE]" in p for n, p in payloads.items() if n.endswith(".json"))
        manifest = manifest_for_files(key, payloads)
        pack = build_pack(manifest, payloads)
        resp = _put(client, ns, key, pack)
        assert resp.status_code == 201, resp.text

        fetched = {
            name: client.get(f"/v1/{ns}/kernels/{key}/files/{name}").content for name in payloads
        }
        assert fetched == payloads
        assert read_pack(client.get(f"/v1/{ns}/kernels/{key}").content)[1] == payloads

        kdir: Path = by_key[key].dir
        on_disk = {p.name: p.read_bytes() for p in kdir.iterdir() if p.is_file()}
        assert substitute_dir(fetched, str(kdir)) == on_disk


def test_list_entries_pages_in_key_order_with_a_prefix(client: httpx.Client, ns: str) -> None:
    """``GET /v1/{ns}/entries/{layer}``: what ``kcache ls --entries`` shows (issue #32)."""
    keys = [f"pt2:fx-graph-v1::k{i}:c1" for i in range(5)] + ["other"]
    for key in keys:
        assert client.put(f"/v1/{ns}/entries/fx-graph/{key}", content=key.encode()).status_code == 201
    assert client.put(f"/v1/{ns}/entries/autotune/k0", content=b"t").status_code == 201
    seen: list[str] = []
    cursor = ""
    while True:
        page = client.get(f"/v1/{ns}/entries/fx-graph", params={"limit": 2, "cursor": cursor})
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["items"]) <= 2
        seen += [e["key"] for e in body["items"]]
        assert all(e["layer"] == "fx-graph" and e["size"] == len(e["key"]) for e in body["items"])
        cursor = body["next_cursor"] or ""
        if not cursor:
            break
    assert seen == sorted(keys)
    prefixed = client.get(f"/v1/{ns}/entries/fx-graph", params={"prefix": "pt2:fx-graph-v1::k3"}).json()
    assert [e["key"] for e in prefixed["items"]] == ["pt2:fx-graph-v1::k3:c1"] and prefixed["next_cursor"] is None
    assert client.get(f"/v1/{ns}/entries/dynamo").json() == {"items": [], "next_cursor": None}
    assert_error(client.get(f"/v1/{ns}/entries/Not_A_Layer"), 400, "invalid_key")
    assert client.get(f"/v1/{ns}/entries/fx-graph", params={"prefix": "a/b"}).status_code == 422
    assert client.get(f"/v1/{ns}/entries/fx-graph", params={"limit": 0}).status_code == 422
