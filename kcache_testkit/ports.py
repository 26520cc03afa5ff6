"""Loopback ports and processes: free ports, waiting for a server, stopping what we started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

HOST = "127.0.0.1"

_port_lock = threading.Lock()
_handed_out: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(n: int, *, grpc_pairs: bool = False) -> list[int]:
    """``n`` distinct ports that are free now, never handed out before in this process.

    Ports come from the kernel (bind to 0), below 55535. With ``grpc_pairs`` each port ``p``
    also has ``p + 10000`` free (and reserved): SeaweedFS derives gRPC ports that way in places
    where its flags do not reach.
    """
    out: list[int] = []
    socks: list[socket.socket] = []
    with _port_lock:
        try:
            while len(out) < n:
                s = socket.socket()
                s.bind((HOST, 0))
                socks.append(s)
                port = int(s.getsockname()[1])
                if port >= 55535 or port in _handed_out:
                    continue
                if grpc_pairs and (port + 10000 in _handed_out or not _bindable(port + 10000)):
                    continue
                out.append(port)
                _handed_out.add(port)
                if grpc_pairs:
                    _handed_out.add(port + 10000)
        finally:
            for s in socks:
                s.close()
    return out


def free_port() -> int:
    """One port that is free now (a port free now may still be taken before a server binds it:
    launchers retry on "address already in use")."""
    return free_ports(1)[0]


def port_open(port: int, host: str = HOST) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def wait_until(what: str, check: Callable[[], object], timeout: float,
               proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Poll ``check`` until it is truthy; fail early, with the log's tail, if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what}: process exited with {proc.returncode}\n{tail}")
        try:
            if check():
                return
        except Exception as exc:  # servers say all sorts of things while starting
            last = exc
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise TimeoutError(f"{what} not ready after {timeout}s (last error: {last!r})\n{tail}")


def kill(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL, *, group: bool = False) -> None:
    """Stop one process we started, and reap it; ``group``: its whole session (a server started
    with ``start_new_session=True`` whose workers must go with it)."""
    if proc is None or proc.poll() is not None:
        return

    def send(s: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, s)
            else:
                os.kill(proc.pid, s)

    send(signal.SIGCONT)  # a paused process cannot handle SIGTERM
    send(sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout=10)
