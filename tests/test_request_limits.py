"""What a slow, stalled or vanishing client costs a real ``kcache serve`` (issue #17): request
bodies have deadlines (408), a replica's memory budget refuses what it cannot hold (503 with
``Retry-After``), and a client that disconnects mid-upload is no server error (logged at info,
counted under status 499).

Raw sockets play the clients: httpx would not stall or hang up halfway on purpose.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from kcache_testkit.pace import bound
from kcache_testkit.service import ServerProcess, clean_env

pytestmark = pytest.mark.slow

MIB = 1 << 20
ENTRY = "/v1/lim/entries/fx-graph/{}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits")
    env = clean_env(
        KCACHE_BODY_IDLE_TIMEOUT_S="1", KCACHE_BODY_TIMEOUT_S="4",
        KCACHE_MEMORY_BUDGET_BYTES=str(16 * MIB), KCACHE_LOG_LEVEL="info",
    )
    with ServerProcess(root / "data", root, env=env) as srv:
        yield srv


def _start_upload(srv: ServerProcess, key: str, declared: int, first: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=15)
    head = f"PUT {ENTRY.format(key)} HTTP/1.1\r\nHost: kcache\r\nContent-Length: {declared}\r\n\r\n"
    sock.sendall(head.encode() + first)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _metric(c: httpx.Client, status: int) -> float:
    text = c.get("/metrics").text
    found = re.search(
        r'kcache_http_requests_total\{method="PUT",route="/v1/\{namespace\}/entries/\{layer\}/\{key\}",'
        rf'status="{status}"\}} ([0-9.e+]+)', text,
    )
    return float(found.group(1)) if found else 0.0


def test_a_trickling_upload_holds_the_budget_until_its_deadline(server: ServerProcess) -> None:
    """A declares 12 of the 16 MiB budget and sends a byte every 0.3 s (never idle for 1 s): an
    8 MiB upload meanwhile is a 503 with Retry-After; A is cut off at the 4 s body deadline (408,
    connection closed), and then the 8 MiB upload goes through."""
    a = _start_upload(server, "trickle", 12 * MIB, b"x" * 1024)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.3):
            try:
                a.send(b"x")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    body = b"y" * (8 * MIB)
    try:
        with server.client() as c:
            refused = None
            while time.monotonic() - started < 3 and refused is None:
                r = c.put(ENTRY.format("eight-mib"), content=body)
                if r.status_code == 503:
                    refused = r
                else:  # A's route may not have taken its share yet
                    assert r.status_code == 201 and c.delete(ENTRY.format("eight-mib")).status_code == 204
                    time.sleep(0.05)
            assert refused is not None, "an 8 MiB upload was never refused while 12 of 16 MiB were held"
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "overloaded"
            assert "memory budget" in refused.json()["error"]["message"]

            raw = _read_until_closed(a)  # the server closes A's connection after its 408
            assert _status(raw) == 408, raw[:300]
            assert b"connection: close" in raw.lower() and b"request_timeout" in raw
            assert 3.5 < time.monotonic() - started < bound(4.0, 20_000)  # the 4 s deadline, not the idle one
            assert c.put(ENTRY.format("eight-mib"), content=body).status_code == 201  # budget back
            assert c.head(ENTRY.format("trickle")).status_code == 404
    finally:
        stop.set()
        a.close()


def test_a_stalled_upload_is_cut_off_when_idle(server: ServerProcess) -> None:
    with server.client() as c:
        before = _metric(c, 408)
        sock = _start_upload(server, "stalled", 40 * MIB, b"z" * 4096)
        started = time.monotonic()
        raw = _read_until_closed(sock)
        sock.close()
        assert _status(raw) == 408 and b"between its parts" in raw, raw[:300]
        assert time.monotonic() - started < bound(1.0, 18_000)  # the 1 s idle deadline
        assert _metric(c, 408) == before + 1
        assert c.head(ENTRY.format("stalled")).status_code == 404


def test_a_client_that_hangs_up_mid_upload_is_not_a_server_error(server: ServerProcess) -> None:
    with server.client() as c:
        before = _metric(c, 499)
        sock = _start_upload(server, "gone", MIB, b"w" * 1000)
        time.sleep(0.3)
        sock.close()
        deadline = time.monotonic() + 10
        while _metric(c, 499) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metric(c, 499) == before + 1
        assert _metric(c, 500) == 0
        assert c.head(ENTRY.format("gone")).status_code == 404
    log = server.stderr()
    assert "client closed the connection during the request body" in log
    assert "Traceback" not in log and '"level": "error"' not in log
