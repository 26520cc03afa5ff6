"""The one launcher of a real ``kcache serve`` process, and the environments tests run things in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kcache_testkit.pace import HANG_S
from kcache_testkit.ports import HOST, free_port, kill, wait_until

REPO = Path(__file__).resolve().parent.parent


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any KCACHE_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def server_env(root: Path, **extra: str) -> dict[str, str]:
    """For a service with configured backends: no KCACHE_* and no AWS_* of the developer's (their
    profile must never reach the test S3), AWS config files that do not exist, quiet logs."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("AWS_")}
    env |= {
        "KCACHE_LOG_LEVEL": "warning",
        "KCACHE_AUTOLOAD": "0",
        "AWS_CONFIG_FILE": str(root / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-credentials"),
    }
    return env | extra


def kcache_cmd() -> list[str]:
    """The installed ``kcache`` script next to this interpreter, else ``python -m kcache.cli``."""
    script = Path(sys.executable).parent / "kcache"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kcache.cli"]


@dataclass
class ServerProcess:
    """``kcache serve`` (the production command) as a subprocess on a free loopback port.

    ``start()`` launches and waits until ``ready_path`` answers 200 (``/readyz`` to also wait for
    configured backends), retrying on another port if the picked one was taken meanwhile.
    Replicas that boot together call ``launch()`` on each, then ``wait_ready()``. The server runs in
    its own session, so ``stop()`` takes uvicorn's workers (``--workers N``) down with it.
    """

    data_dir: Path
    log_dir: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=clean_env)
    name: str = "server"
    ready_path: str = "/healthz"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _starts: int = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        """The server's stderr (its logs and any traceback) of its latest start."""
        return self.log_dir / f"{self.name}-{self._starts}.stderr"

    def launch(self) -> ServerProcess:
        self.port = free_port()
        self._starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [*kcache_cmd(), "serve", "--host", HOST, "--port", str(self.port), "--data-dir", str(self.data_dir), *self.args]
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         env=self.env, cwd=REPO, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = HANG_S) -> ServerProcess:
        wait_until(f"kcache serve :{self.port}",
                   lambda: httpx.get(f"{self.url}{self.ready_path}", timeout=5).status_code == 200,
                   timeout, self.proc, self.log)
        return self

    def start(self, timeout: float = HANG_S) -> ServerProcess:
        for _attempt in range(3):  # a port picked free may be taken before uvicorn binds it
            self.launch()
            try:
                return self.wait_ready(timeout)
            except (RuntimeError, TimeoutError):
                self.stop()
                if "address already in use" not in self.stderr().lower():
                    raise
        raise RuntimeError(f"kcache serve found no free port:\n{self.stderr()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Stop the server (and its workers); its exit status, None if it was not running."""
        if self.proc is None:
            return None
        kill(self.proc, sig, group=True)
        rc = self.proc.returncode
        self.proc = None
        return rc

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=HANG_S, **kw)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def backend_server(root: Path, env: dict[str, str], name: str = "server") -> ServerProcess:
    """A ``kcache serve`` with configured backends (``env``: KCACHE_BLOB_URL, ...), ready when
    ``/readyz`` says its backends answer; not launched yet (replicas boot together)."""
    return ServerProcess(root / "data", root, env=server_env(root, **env), name=name, ready_path="/readyz")


def with_testkit(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a job process that imports the test kit (e.g. to compile real kernels): the
    repository root first on its PYTHONPATH, the way a user's own packages are found."""
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path}
