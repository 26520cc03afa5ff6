"""What a slow, stalled or vanishing client costs a real ``kcache serve`` (issue #17): request
bodies have deadlines (408), a replica's memory budget refuses what it cannot hold (503 with
``Retry-After``) but counts only bytes that arrived, so trickling clients cannot starve it (issue
#31), and a client that disconnects mid-upload is no server error (logged at info, counted under
status 499).

Raw sockets play the clients: httpx would not stall or hang up halfway on purpose.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kcache_testkit.kernels import Kernel
from kcache_testkit.pace import HANG_S, bound
from kcache_testkit.service import ServerProcess, clean_env

pytestmark = pytest.mark.slow
pytest_plugins = ["api_helpers"]

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
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=HANG_S)
    head = f"PUT {ENTRY.format(key)} HTTP/1.1\r\nHost: kcache\r\nContent-Length: {declared}\r\n\r\n"
    sock.sendall(head.encode() + first)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """What the server sent until it closed the connection. A close can arrive as a reset: the
    test's trickle may still write a byte after the server closed, and the server's kernel then
    answers with RST (seen in a full-suite run); what was read before it is the answer."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
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


def _in_flight(c: httpx.Client) -> float:
    found = re.search(r"^kcache_http_requests_in_flight ([0-9.e+]+)$", c.get("/metrics").text, re.MULTILINE)
    assert found is not None
    return float(found.group(1))


def _answered(sock: socket.socket) -> bool:
    """Whether the server has answered (or closed) this connection yet; reads nothing."""
    return bool(select.select([sock], [], [], 0)[0])


def _trickle(socks: list[socket.socket], every_s: float) -> threading.Event:
    """Send each socket a byte every ``every_s`` (never idle long enough to be cut off for it)
    until the returned event is set."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(b"x")

    threading.Thread(target=run, daemon=True).start()
    return stop


def test_an_upload_holds_the_bytes_it_sent_until_its_deadline(server: ServerProcess) -> None:
    """A sends 12 of the 16 MiB budget, then a byte every 0.3 s: an 8 MiB upload meanwhile is a
    503 with Retry-After; A is cut off at the 4 s body deadline (408, connection closed), and
    then the 8 MiB upload goes through."""
    started = time.monotonic()
    a = _start_upload(server, "held", 13 * MIB, b"x" * (12 * MIB))
    stop = _trickle([a], 0.3)
    body = b"y" * (8 * MIB)
    try:
        with server.client() as c:
            refused = None
            while refused is None and not _answered(a):
                r = c.put(ENTRY.format("eight-mib"), content=body)
                if r.status_code == 503:
                    refused = r
                else:  # A's route may not have taken its bytes yet
                    assert r.status_code == 201 and c.delete(ENTRY.format("eight-mib")).status_code == 204
                    time.sleep(0.05)
            assert refused is not None, "an 8 MiB upload was never refused while A held 12 of 16 MiB"
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "overloaded"
            assert "memory budget" in refused.json()["error"]["message"]

            raw = _read_until_closed(a)  # the server closes A's connection after its 408
            assert _status(raw) == 408, raw[:300]
            assert b"connection: close" in raw.lower() and b"request_timeout" in raw
            assert 3.5 < time.monotonic() - started < bound(4.0, 20_000)  # the 4 s deadline, not the idle one
            assert c.put(ENTRY.format("eight-mib"), content=body).status_code == 201  # budget back
            assert c.head(ENTRY.format("held")).status_code == 404
    finally:
        stop.set()
        a.close()


def test_trickling_uploads_do_not_starve_the_replica(tmp_path: Path, kernels: list[Kernel]) -> None:
    """Issue #31: four connections declare uploads that together fill the whole budget and then
    trickle a byte every 0.3 s. Before, the budget was reserved from their declared sizes, and
    every upload and file view on the replica answered 503 until their body deadline. Now they
    hold what they sent (bytes), and a small upload, an 8 MiB upload and a file view all land
    while the four are still connected."""
    env = clean_env(KCACHE_BODY_IDLE_TIMEOUT_S="10", KCACHE_BODY_TIMEOUT_S="120",
                    KCACHE_MEMORY_BUDGET_BYTES=str(16 * MIB))
    k = kernels[0]
    with ServerProcess(tmp_path / "data", tmp_path, env=env) as srv, srv.client() as c:
        assert c.put(f"/v1/lim/kernels/{k.key}", content=k.pack).status_code == 201
        tricklers = [_start_upload(srv, f"trickle-{i}", 4 * MIB, b"x") for i in range(4)]
        stop = _trickle(tricklers, 0.3)
        try:
            # Their routes have started (and, before the fix, reserved their declared sizes):
            # four in flight, and the scrape itself.
            while _in_flight(c) < 5:
                time.sleep(0.05)
            assert c.put(ENTRY.format("small"), content=b"s" * 1000).status_code == 201
            assert c.put(ENTRY.format("eight-mib"), content=b"y" * (8 * MIB)).status_code == 201
            view = c.get(f"/v1/lim/kernels/{k.key}/files/{k.name}.ptx")
            assert view.status_code == 200 and view.content == k.files[f"{k.name}.ptx"]
            assert not any(_answered(t) for t in tricklers), "a trickler was answered: the test proved nothing"
        finally:
            stop.set()
            for t in tricklers:
                t.close()
        assert "Traceback" not in srv.stderr()


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
        deadline = time.monotonic() + HANG_S  # a hang guard: the loop ends with the count
        while _metric(c, 499) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metric(c, 499) == before + 1
        assert _metric(c, 500) == 0
        assert c.head(ENTRY.format("gone")).status_code == 404
    log = server.stderr()
    assert "client closed the connection during the request body" in log
    assert "Traceback" not in log and '"level": "error"' not in log
