"""Fixtures for client tests: a real kcache service on loopback (uvicorn in a thread) and real
Triton kernel dirs. ``kcache serve`` as a subprocess is :class:`kcache_testkit.service.ServerProcess`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from kcache_server.app import create_app
from kcache_server.settings import Settings

from kcache_testkit.pace import HANG_S
from kcache_testkit.ports import free_port


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
        deadline = time.monotonic() + HANG_S  # a hang guard: a loaded machine starts it slower
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
    from kcache_testkit.corpus import compile_small

    return compile_small(tmp_path_factory.mktemp("triton-src"), count=4)
