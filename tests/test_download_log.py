"""The opt-in download log (``KCACHE_DOWNLOAD_LOG``, :mod:`kcache_server.downloads`): one line per
pack or entry handed out, with its key, on every path that hands one out (pack GET, each pack of
a batch-get, entry GET), none for what is not a download (HEAD, manifests, misses), nothing
at all unless it is switched on. Real kernel packs, the app in-process."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kcache_schemas.pack import pack_kernel_dir
from kcache_server import downloads
from kcache_server.app import create_app
from kcache_server.settings import Settings

pytest_plugins = ["live"]

NS = "dl"
ABSENT = "A" * 52


@pytest.fixture(scope="module")
def packs(real_kernel_dirs: list[Path]) -> list[tuple[str, bytes]]:
    return [(d.name, pack_kernel_dir(d)[1]) for d in real_kernel_dirs[:2]]


def _client(tmp_path: Path, on: bool) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "svc", download_log=on))) as client:
        yield client


def _exchange(c: TestClient, packs: list[tuple[str, bytes]]) -> None:
    (k1, p1), (k2, _p2) = packs
    for key, pack in packs:
        assert c.put(f"/v1/{NS}/kernels/{key}", content=pack).status_code == 201
    assert c.put(f"/v1/{NS}/entries/fx-graph/pt2:k=1", content=b"graph" * 10).status_code == 201
    assert c.get(f"/v1/{NS}/kernels/{k1}").content == p1
    assert c.head(f"/v1/{NS}/kernels/{k2}").status_code == 200
    assert c.get(f"/v1/{NS}/kernels/{k1}/manifest").status_code == 200
    assert c.get(f"/v1/{NS}/kernels/{ABSENT}").status_code == 404
    assert c.post(f"/v1/{NS}/kernels:batch-get", json={"keys": [k1, k2, ABSENT]}).status_code == 200
    assert c.get(f"/v1/{NS}/entries/fx-graph/pt2:k=1").content == b"graph" * 10
    assert c.head(f"/v1/{NS}/entries/fx-graph/pt2:k=1").status_code == 200
    assert c.get(f"/v1/{NS}/entries/fx-graph/pt2:absent").status_code == 404


def _logged(caplog: pytest.LogCaptureFixture) -> list[downloads.Download]:
    found = [downloads.parse(r.getMessage()) for r in caplog.records if r.name == "kcache_server.downloads"]
    assert None not in found
    return [d for d in found if d is not None]


def test_every_artifact_handed_out_is_one_line_with_its_key(
    tmp_path: Path, packs: list[tuple[str, bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kcache_server.downloads")
    for c in _client(tmp_path, on=True):
        _exchange(c, packs)
    got = _logged(caplog)
    (k1, p1), (k2, p2) = packs
    assert Counter((d.layer, d.key, d.via) for d in got) == Counter({
        ("kernel", k1, "get"): 1, ("kernel", k1, "batch-get"): 1, ("kernel", k2, "batch-get"): 1,
        ("fx-graph", "pt2:k=1", "get"): 1,
    })
    sizes = {(d.key, d.via): d.size for d in got}
    assert sizes[(k1, "get")] == len(p1) and sizes[(k2, "batch-get")] == len(p2)
    assert all(d.namespace == NS and d.peer for d in got)


def test_nothing_is_logged_unless_switched_on(tmp_path: Path, packs: list[tuple[str, bytes]], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kcache_server.downloads")
    for c in _client(tmp_path, on=False):
        _exchange(c, packs)
    assert _logged(caplog) == []


def test_parse_reads_back_what_record_writes_and_nothing_else() -> None:
    msg = "download ns=team-a layer=fx-graph key=pt2:a=b via=get bytes=12 peer=127.0.0.1:5"
    assert downloads.parse(msg) == downloads.Download("team-a", "fx-graph", "pt2:a=b", "get", 12, "127.0.0.1:5")
    assert downloads.parse('127.0.0.1:5 - "GET /v1/x HTTP/1.1" 200') is None
    assert downloads.parse("download ns=x layer=kernel") is None  # cut short: not a download line
    assert Settings(download_log="1").download_log and not Settings().download_log  # type: ignore[arg-type]
