"""Real misbehaving servers on 127.0.0.1, for fail-open tests.

Nothing here fakes the client: these are real sockets that the real httpx client talks to.

* :class:`FaultServer` — one port whose behaviour can be switched while it runs:

  ``refuse``   the port is bound but not listening: every connect is refused (ECONNREFUSED);
  ``hang``     accepts TCP and never reads or answers (a blackhole behind a load balancer);
  ``http500``  answers every request with HTTP 500 and a JSON error body;
  ``trickle``  answers 200, one byte every ``trickle_interval`` seconds, status line included;
  ``drip``     sends the status line and headers at once, then the body one byte every
               ``trickle_interval`` seconds (a per-read timeout alone never fires);
  ``proxy``    a transparent TCP proxy to ``upstream`` (the service "recovered");
  ``http``     ``handler(Request) -> bytes`` builds each raw response (hostile servers).

  ``connections`` counts accepted TCP connections and ``requests`` parsed HTTP requests, so a
  test can prove that an open circuit breaker kept the client off the network.

* :func:`http_response`, :func:`tar_stream` — building raw responses for hostile servers.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import tarfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MODES = ("refuse", "hang", "http500", "trickle", "drip", "proxy", "http")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def read_request(conn: socket.socket, buf: bytearray | None = None) -> Request | None:
    """Read one HTTP/1.1 request (Content-Length bodies only); None when the peer closed."""
    data = buf if buf is not None else bytearray()
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return Request(method, path, headers, bytes(body[:length]))


def http_response(
    status: int,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    content_length: int | None = None,
) -> bytes:
    """A raw HTTP/1.1 response that closes the connection. ``content_length`` may lie."""
    reason = {200: "OK", 302: "Found", 404: "Not Found", 500: "Internal Server Error"}.get(status, "X")
    hdrs = {"Content-Length": str(len(body) if content_length is None else content_length), "Connection": "close"}
    hdrs.update(headers or {})
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    return head.encode("latin-1") + body


def json_error(status: int, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return http_response(status, body, {"Content-Type": "application/json"})


def tar_stream(members: Iterable[tuple[str, bytes]]) -> bytes:
    """An uncompressed tar, as ``kernels:batch-get`` answers (``index.json`` first by convention)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
    return raw.getvalue()


class FaultServer:
    """A real TCP server on 127.0.0.1 whose misbehaviour can be switched at runtime."""

    def __init__(
        self,
        mode: str = "hang",
        *,
        trickle_interval: float = 1.0,
        upstream: str | None = None,
        handler: Callable[[Request], bytes] | None = None,
    ) -> None:
        self.trickle_interval = trickle_interval
        self.upstream = upstream
        self.handler = handler
        self.connections = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listening = False
        self._sock = self._bind(0)
        self.port = self._sock.getsockname()[1]
        self.mode = "refuse"
        self.set_mode(mode, upstream=upstream, handler=handler)

    # ---- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _bind(port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        return sock

    def set_mode(self, mode: str, *, upstream: str | None = None, handler: Callable[[Request], bytes] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        if upstream is not None:
            self.upstream = upstream
        if handler is not None:
            self.handler = handler
        with self._lock:
            self.mode = mode
            held, self._held = self._held, []
        for conn in held:  # a new mode applies to new connections; drop hung ones
            with contextlib.suppress(OSError):
                conn.close()
        if mode == "refuse" and self._listening:
            # A socket cannot stop listening: close it and re-bind the same port without listen().
            self._listening = False
            old = self._sock
            self._sock = self._bind(self.port)
            with contextlib.suppress(OSError):
                old.shutdown(socket.SHUT_RDWR)
            old.close()
        elif mode != "refuse" and not self._listening:
            self._sock.listen(128)
            self._listening = True
            self._spawn(self._accept_loop, self._sock)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            held, self._held = self._held, []
        for conn in held:
            with contextlib.suppress(OSError):
                conn.close()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> FaultServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]

    # ---- serving --------------------------------------------------------------------------

    def _accept_loop(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed (stop, or switched to refuse)
            with self._lock:
                self.connections += 1
                mode = self.mode
                self._held.append(conn)
            self._spawn(self._serve, conn, mode)

    def _count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def _serve(self, conn: socket.socket, mode: str) -> None:
        try:
            if mode == "hang":
                self._stop.wait()  # hold the connection open, never read, never answer
            elif mode == "proxy":
                self._proxy(conn)
            else:
                req = read_request(conn)
                if req is None:
                    return
                self._count_request()
                if mode == "http500":
                    conn.sendall(json_error(500, "internal", "the fault server always fails"))
                elif mode in ("trickle", "drip"):
                    body = b"x" * 100_000
                    resp = http_response(200, body, {"Content-Type": "application/octet-stream"})
                    head_len = resp.index(b"\r\n\r\n") + 4
                    start = head_len if mode == "drip" else 0
                    conn.sendall(resp[:start])
                    for i in range(start, len(resp)):
                        if self._stop.wait(self.trickle_interval):
                            return
                        conn.sendall(resp[i : i + 1])
                elif mode == "http":
                    assert self.handler is not None
                    conn.sendall(self.handler(req))
        except OSError:
            pass  # the client gave up (timeout) and closed: expected
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _proxy(self, conn: socket.socket) -> None:
        assert self.upstream is not None
        host, port = self.upstream.removeprefix("http://").rstrip("/").split(":")
        up = socket.create_connection((host, int(port)), timeout=10)
        up.settimeout(None)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while chunk := src.recv(65536):
                    dst.sendall(chunk)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=pump, args=(up, conn), daemon=True)
        t.start()
        pump(conn, up)
        t.join(timeout=30)
        up.close()


# ---- the real service -----------------------------------------------------------------------






# ---- filesystem snapshots -------------------------------------------------------------------


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every path under ``root`` (not following links) -> (kind, size), for before/after diffs."""
    out: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            kind = "link" if os.path.islink(p) else "dir" if os.path.isdir(p) else "file"
            out[os.path.relpath(p, root)] = (kind, st.st_size if kind == "file" else 0)
    return out
