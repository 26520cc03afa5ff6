"""`kcache serve` as a user runs it: the embedded default (files + SQLite) in a data dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kcache_testkit.kernels import Kernel
from kcache_testkit.service import ServerProcess

pytest.register_assert_rewrite("api_helpers")



pytest_plugins = ["api_helpers"]

pytestmark = pytest.mark.slow


def _json_lines(stderr: str) -> list[dict[str, object]]:
    """Every log line is one JSON object; the only plain lines are kcache's start-up banner."""
    records = []
    for line in stderr.splitlines():
        if not line.strip() or line.startswith("kcache: "):
            continue
        record = json.loads(line)  # fails the test on any non-JSON log line
        assert isinstance(record, dict)
        assert {"ts", "level", "logger", "msg"} <= set(record), record
        records.append(record)
    return records


def test_serve_embedded_default_survives_restart(tmp_path: Path, kernels: list[Kernel]) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data, tmp_path).start()
    try:
        with server.client() as c:
            for k in kernels[:2]:
                assert c.put(f"/v1/default/kernels/{k.key}", content=k.pack).status_code == 201
            assert c.put("/v1/default/entries/fx-graph/k1", content=b"fx-entry").status_code == 201
            assert c.get("/readyz").json()["status"] == "ready"
    finally:
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it (exit status -15).
        assert server.stop() in (0, -15)
    first_log = server.stderr()
    assert "Application shutdown complete" in first_log

    # It says where the data lives, and it lives there.
    assert f"kcache: data in {data.resolve()}" in first_log
    assert f"serving on http://127.0.0.1:{server.port}" in first_log
    assert (data / "index.sqlite3").is_file()
    blobs = [p for p in (data / "blobs").rglob("*") if p.is_file()]
    stored = sorted(p.read_bytes() for p in blobs)
    assert sorted([kernels[0].pack, kernels[1].pack, b"fx-entry"]) == stored

    records = _json_lines(first_log)
    loggers = {r["logger"] for r in records}
    assert "kcache_server" in loggers and "uvicorn.access" in loggers, loggers
    assert any("PUT /v1/default/kernels/" in str(r["msg"]) for r in records if r["logger"] == "uvicorn.access")
    assert all(r["level"] in {"debug", "info", "warning", "error", "critical"} for r in records)

    # Restart on the same dir: everything is still there.
    server.start()
    try:
        with server.client() as c:
            for k in kernels[:2]:
                got = c.get(f"/v1/default/kernels/{k.key}")
                assert got.status_code == 200 and got.content == k.pack
            assert c.get("/v1/default/entries/fx-graph/k1").content == b"fx-entry"
            listing = c.get("/v1/default/kernels").json()
            assert sorted(i["key"] for i in listing["items"]) == sorted(k.key for k in kernels[:2])
            assert c.put(f"/v1/default/kernels/{kernels[0].key}", content=kernels[0].pack).status_code == 200
    finally:
        assert server.stop() in (0, -15)
    _json_lines(server.stderr())


def test_serve_error_responses_are_logged_as_json(tmp_path: Path, kernel: Kernel) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path).start()
    try:
        with server.client() as c:
            assert c.put(f"/v1/default/kernels/{kernel.key}", content=b"junk").status_code == 400
            assert c.get("/v1/default/kernels/not-a-key").status_code == 400
    finally:
        server.stop()
    records = _json_lines(server.stderr())
    access = [str(r["msg"]) for r in records if r["logger"] == "uvicorn.access"]
    assert any("400" in m and kernel.key in m for m in access), access
