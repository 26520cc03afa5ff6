"""A real kcache service on loopback (uvicorn in a thread, or ``kcache serve`` in a subprocess) and real
Triton kernels, for client tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from kcache_server.app import create_app
from kcache_server.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any KCACHE_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def kcache_cmd() -> list[str]:
    """The installed ``kcache`` script next to this interpreter, else ``python -m kcache.cli``."""
    script = Path(sys.executable).parent / "kcache"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kcache.cli"]


@dataclass
class ServerProcess:
    data_dir: Path
    log_dir: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=clean_env)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"server-{self._starts}.stderr"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        for _attempt in range(3):  # a port picked free may be taken before uvicorn binds it
            self.port = free_port()
            self._starts += 1
            with open(self.stderr_path, "wb") as err:
                self.proc = subprocess.Popen(
                    [*kcache_cmd(), "serve", "--port", str(self.port), "--data-dir", str(self.data_dir), *self.args],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=self.env, cwd=REPO,
                )
            if self._wait_ready(timeout):
                return self
            if "address already in use" not in self.stderr().lower():
                break
        raise RuntimeError(f"kcache serve did not become healthy:\n{self.stderr()[-3000:]}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        return False

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        rc = self.proc.returncode
        self.proc = None
        return rc

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kw)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LiveService:
    """``create_app`` served by a real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        self.port = free_port()
        self.settings = Settings(data_dir=data_dir, port=self.port, access_flush_s=0.2, **settings)
        config = uvicorn.Config(create_app(self.settings), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveService:
        self.thread.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("service did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_service(tmp_path: Path) -> Iterator[LiveService]:
    with LiveService(tmp_path / "service") as svc:
        yield svc


@pytest.fixture(scope="session")
def real_kernel_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A few real sm_90 kernel dirs compiled by Triton on the CPU (shared, read-only)."""
    from bench.corpus import compile_small

    return compile_small(tmp_path_factory.mktemp("triton-src"), count=4)
