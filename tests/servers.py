"""Real storage servers for the tests: SeaweedFS (S3), Redis, a Redis Cluster (the launchers are
:mod:`kcache_testkit.storage_servers`, shared with the benchmarks). Session-wide servers start lazily on first use (a test run that touches no S3 or
Redis backend starts nothing) and stop when pytest ends (``config.add_cleanup``; ``atexit`` as a
fallback). Tests get independent views of them: a fresh key prefix (Redis) or object prefix (S3)
each, cleaned up afterwards.

The shared Redis is the one on 127.0.0.1:6379 (started, daemonized, if it is down). Tests that
break servers on purpose (test_degraded.py) start their own with :class:`RedisServer` and
:class:`SeaweedFS` and never touch the shared ones.

Set ``KCACHE_TEST_SERVERS=require`` (CI does) to fail instead of skipping when a server binary
(``weed``, ``redis-server``, ``redis-cli``) is missing.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kcache_testkit.pace import HANG_S
from kcache_testkit.ports import HOST, wait_until
from kcache_testkit.storage_servers import (
    S3_ACCESS_KEY,
    S3_REGION,
    S3_SECRET_KEY,
    RedisClusterServers,
    RedisServer,
    SeaweedFS,
    binary,
    redis_ping,
    unique,
)

# Tests reach these through this module (servers.SeaweedFS(...), servers.unique(...)).
__all__ = ["RedisServer", "SeaweedFS", "unique"]

SHARED_REDIS_PORT = 6379
TEST_BUCKET = "kcache-test"

_lock = threading.Lock()


def ensure_shared_redis() -> str:
    """The Redis on 127.0.0.1:6379 that tests share (each under its own key prefix)."""
    if not redis_ping(SHARED_REDIS_PORT):
        Path("/var/lib/redis").mkdir(parents=True, exist_ok=True)
        Path("/var/log/redis").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [binary("redis-server"), "--daemonize", "yes", "--bind", "127.0.0.1", "-::1",
             "--port", str(SHARED_REDIS_PORT), "--save", "", "--appendonly", "no",
             "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"],
            check=True, timeout=30,
        )
        wait_until("shared redis :6379", lambda: redis_ping(SHARED_REDIS_PORT), HANG_S)
    return f"redis://{HOST}:{SHARED_REDIS_PORT}/0"


def drop_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix:`` (standalone or cluster URL)."""
    from kcache_server.storage.redis_index import RedisIndex

    idx = RedisIndex(url, timeout_s=10, prefix=prefix)
    try:
        client = idx._redis()
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            pipe = client.pipeline(transaction=False)
            for k in keys[i : i + 500]:
                pipe.unlink(k)
            pipe.execute()
    finally:
        idx.close()


# ---- session-wide servers ------------------------------------------------------------------------

_servers: dict[str, Any] = {}


def _session_root(config: pytest.Config) -> Path:
    if "root" not in _servers:
        root = Path(tempfile.mkdtemp(prefix="kcache-servers-"))
        _servers["root"] = root
        config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    return Path(_servers["root"])


def _register_stop(config: pytest.Config, name: str, stop: Any) -> None:
    def once() -> None:
        if _servers.pop(name, None) is not None:
            stop()

    config.add_cleanup(once)
    atexit.register(once)


def _failed_before(name: str) -> None:
    # A server that failed to start fails every later test at once instead of retrying for a
    # minute each time.
    if f"{name}-error" in _servers:
        pytest.fail(f"{name} did not start earlier in this session: {_servers[f'{name}-error']}")


def seaweedfs(config: pytest.Config) -> SeaweedFS:
    """The session's SeaweedFS, started on first use, with :data:`TEST_BUCKET` created."""
    with _lock:
        _failed_before("seaweedfs")
        if "seaweedfs" not in _servers:
            server = SeaweedFS(Path(tempfile.mkdtemp(prefix="seaweedfs-", dir=_session_root(config))))
            try:
                server.start()
                server.create_bucket(TEST_BUCKET)
            except BaseException as exc:
                server.stop()
                _servers["seaweedfs-error"] = repr(exc)[:2000]
                raise
            _servers["seaweedfs"] = server
            _register_stop(config, "seaweedfs", server.stop)
        return _servers["seaweedfs"]  # type: ignore[no-any-return]


def redis_cluster(config: pytest.Config) -> RedisClusterServers:
    """The session's 3-master Redis Cluster, started on first use."""
    with _lock:
        _failed_before("cluster")
        if "cluster" not in _servers:
            cluster = RedisClusterServers(Path(tempfile.mkdtemp(prefix="cluster-", dir=_session_root(config))))
            try:
                cluster.start()
            except BaseException as exc:
                cluster.stop()
                _servers["cluster-error"] = repr(exc)[:2000]
                raise
            _servers["cluster"] = cluster
            _register_stop(config, "cluster", cluster.stop)
        return _servers["cluster"]  # type: ignore[no-any-return]


def shared_redis_url(config: pytest.Config) -> str:
    with _lock:
        if "redis" not in _servers:
            _servers["redis"] = ensure_shared_redis()  # shared: never stopped by us
        return str(_servers["redis"])


# ---- per-test views --------------------------------------------------------------------------------


def isolate_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials of the test SeaweedFS, and nothing from the developer's ~/.aws."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@contextlib.contextmanager
def s3_view(request: pytest.FixtureRequest, tmp_path: Path, timeout_s: float = 5.0) -> Iterator[Any]:
    """A fresh, empty S3BlobStore: the session bucket under a prefix of its own."""
    from kcache_server.storage.s3_blobs import S3BlobStore

    server = seaweedfs(request.config)
    isolate_aws_env(request.getfixturevalue("monkeypatch"), tmp_path)
    prefix = unique("blobs-")
    store = S3BlobStore(f"s3://{TEST_BUCKET}/{prefix}", timeout_s=timeout_s, endpoint_url=server.endpoint)
    try:
        yield store
    finally:
        store.close()
        server.empty(TEST_BUCKET, prefix)


@contextlib.contextmanager
def redis_view(url: str, timeout_s: float = 5.0) -> Iterator[Any]:
    """A fresh, empty RedisIndex on ``url`` under a key prefix of its own; dropped afterwards."""
    from kcache_server.storage.redis_index import RedisIndex

    prefix = unique("kct-")
    idx = RedisIndex(f"{url}{'&' if '?' in url else '?'}prefix={prefix}", timeout_s=timeout_s)
    try:
        yield idx
    finally:
        idx.close()
        drop_prefix(url, prefix)


# ---- misbehaving endpoints ---------------------------------------------------------------------


class BadListener:
    """A loopback TCP port that accepts connections and then misbehaves.

    ``hang``: never reads or answers (a blackholed or frozen server behind a live socket);
    ``reset``: closes each connection at once with a TCP RST (a crashing server/proxy).
    A port with nothing listening (``free_ports(1)``) is the third shape: connection refused.
    """

    def __init__(self, mode: str) -> None:
        assert mode in ("hang", "reset")
        self.mode = mode
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            if self.mode == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            else:
                self._held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
        for conn in self._held:
            conn.close()

    def __enter__(self) -> BadListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
