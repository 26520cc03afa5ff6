"""Real storage servers on loopback for the tests: SeaweedFS (S3), Redis, a Redis Cluster.

Every server listens on 127.0.0.1 on ports picked free at start, so parallel runs on one machine
never collide. Session-wide servers start lazily on first use (a test run that touches no S3 or
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
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HOST = "127.0.0.1"
S3_ACCESS_KEY = "kcache-test-access"
S3_SECRET_KEY = "kcache-test-secret-0123456789abcdef"
S3_REGION = "us-east-1"
SHARED_REDIS_PORT = 6379
TEST_BUCKET = "kcache-test"

_lock = threading.Lock()
_port_lock = threading.Lock()
_handed_out: set[int] = set()


# ---- small utilities ------------------------------------------------------------------------


def binary(name: str) -> str:
    """Path of a server binary; skip (or fail under KCACHE_TEST_SERVERS=require) if absent."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    msg = f"{name} not found on PATH (needed for the real-server tests)"
    if os.environ.get("KCACHE_TEST_SERVERS") == "require":
        pytest.fail(msg)
    pytest.skip(msg)


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
                port = s.getsockname()[1]
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


def port_open(port: int, host: str = HOST) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def wait_until(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None,
               log: Path | None = None) -> None:
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


def kill(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    """Stop one process we started (by its pid), and reap it."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# ---- SeaweedFS ---------------------------------------------------------------------------------


class SeaweedFS:
    """``weed mini`` (master + volume + filer + S3 in one process) on free loopback ports.

    Ports and the data dir are fixed at construction, so :meth:`restart` brings the same
    server back with its data, as after a crash.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "weed.log"
        # Every HTTP port p with its gRPC port at p + 10000, SeaweedFS's own convention.
        self.s3, self.master, self.volume, self.filer, self.webdav, self.admin = free_ports(6, grpc_pairs=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.s3}"

    def env(self) -> dict[str, str]:
        """Environment for a process (a kcache service) that talks to this S3."""
        return {
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
            "AWS_DEFAULT_REGION": S3_REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "KCACHE_S3_ENDPOINT_URL": self.endpoint,
        }

    def command(self) -> list[str]:
        return [
            binary("weed"), "mini",
            f"-dir={self.data}", f"-ip={HOST}", f"-ip.bind={HOST}",
            f"-s3.port={self.s3}", f"-s3.port.grpc={self.s3 + 10000}",
            f"-s3.config={self.root / 'identities.json'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-master.port={self.master}", f"-master.port.grpc={self.master + 10000}",
            f"-volume.port={self.volume}", f"-volume.port.grpc={self.volume + 10000}",
            f"-filer.port={self.filer}", f"-filer.port.grpc={self.filer + 10000}",
            "-webdav=false", f"-webdav.port={self.webdav}",
            f"-admin.port={self.admin}", f"-admin.port.grpc={self.admin + 10000}",
            "-admin.ui=false", "-master.telemetry=false",
            "-volume.max=16", "-master.volumeSizeLimitMB=256",
            # A single master that resumes its raft state after a crash waits 5-20 s for an
            # election before it assigns writes again; without it a restart is whole in ~1 s
            # (volume ids come back from the volume server's heartbeat).
            "-master.resumeState=false",
        ]

    def start(self, timeout: float = 60) -> SeaweedFS:
        self.data.mkdir(parents=True, exist_ok=True)
        identities = {"identities": [{
            "name": "kcache-test",
            "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        (self.root / "identities.json").write_text(json.dumps(identities))
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.root, start_new_session=True,
            )
        client = self.client()
        wait_until("SeaweedFS S3", lambda: client.list_buckets() is not None, timeout, self.proc, self.log)
        return self

    def wait_writable(self, bucket: str, timeout: float = 60) -> None:
        """Wait until an object can be written: the volume server registers after the S3 port opens."""
        client = self.client()
        wait_until(
            "SeaweedFS writes",
            lambda: client.put_object(Bucket=bucket, Key=".kcache-probe", Body=b"ok") is not None,
            timeout, self.proc, self.log,
        )

    def wait_serving(self, bucket: str, timeout: float = 60) -> None:
        """Wait until objects can be written and read back (volume servers registered)."""
        client = self.client()
        self.wait_writable(bucket, timeout)
        wait_until(
            "SeaweedFS reads",
            lambda: client.get_object(Bucket=bucket, Key=".kcache-probe")["Body"].read() == b"ok",
            timeout, self.proc, self.log,
        )

    def stop(self, sig: int = signal.SIGKILL) -> None:
        kill(self.proc, sig)
        self.proc = None

    def restart(self, timeout: float = 60) -> None:
        self.stop()
        self.start(timeout)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY, region_name=S3_REGION,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30,
                          retries={"total_max_attempts": 1}),
        )

    def create_bucket(self, name: str) -> str:
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou,
                                 client.exceptions.BucketAlreadyExists):
            client.create_bucket(Bucket=name)
        self.wait_writable(name)
        return name

    def empty(self, bucket: str, prefix: str) -> None:
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objs:
                client.delete_objects(Bucket=bucket, Delete={"Objects": objs, "Quiet": True})


# ---- Redis -------------------------------------------------------------------------------------


class RedisServer:
    """One ``redis-server`` we own (not daemonized, so we hold its pid) on a free port."""

    def __init__(self, root: Path, port: int | None = None, extra: list[str] | None = None) -> None:
        self.root = root
        self.port = port or free_ports(1)[0]
        self.extra = extra or []
        self.log = root / f"redis-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self, timeout: float = 20) -> RedisServer:
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [
            binary("redis-server"), "--port", str(self.port), "--bind", HOST,
            "--save", "", "--appendonly", "no", "--dir", str(self.root),
            "--logfile", str(self.log), "--daemonize", "no", *self.extra,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        wait_until(f"redis-server :{self.port}", lambda: redis_ping(self.port), timeout, self.proc, self.log)
        return self

    def stop(self, sig: int = signal.SIGKILL) -> None:
        kill(self.proc, sig)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


def redis_ping(port: int) -> bool:
    import redis

    client = redis.Redis(host=HOST, port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisClusterServers:
    """Three masters, no replicas, on free loopback ports (data and cluster bus)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        ports = free_ports(6)
        self.nodes = [
            RedisServer(root / f"node{i}", ports[i], [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(root / f"node{i}" / "nodes.conf"),
                "--cluster-port", str(ports[3 + i]),
                "--cluster-node-timeout", "3000",
            ])
            for i in range(3)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 60) -> RedisClusterServers:
        for node in self.nodes:
            node.start()
        create = subprocess.run(
            [binary("redis-cli"), "--cluster", "create", *(f"{HOST}:{n.port}" for n in self.nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout,
        )
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout[-3000:]}\n{create.stderr[-3000:]}")
        import redis

        def all_ok() -> bool:
            for n in self.nodes:
                client = redis.Redis(host=HOST, port=n.port, decode_responses=True)
                try:
                    info = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]  # a dict
                    state = info.get("cluster_state") if isinstance(info, dict) else str(info)
                    if state != "ok" and "cluster_state:ok" not in str(state):
                        return False
                finally:
                    client.close()
            return True

        wait_until("Redis Cluster", all_ok, timeout)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


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
        wait_until("shared redis :6379", lambda: redis_ping(SHARED_REDIS_PORT), 20)
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


# ---- kcache service processes ------------------------------------------------------------------


class KcacheService:
    """A real ``kcache serve`` process (uvicorn, one worker) on a free loopback port."""

    def __init__(self, root: Path, env: dict[str, str], name: str = "kcache") -> None:
        self.root = root
        self.port = free_ports(1)[0]
        self.env = env
        self.log = root / f"{name}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def launch(self) -> KcacheService:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "AWS_"))}
        env.update({
            "KCACHE_DATA_DIR": str(self.root / "data"),
            "KCACHE_LOG_LEVEL": "warning",
            "AWS_CONFIG_FILE": str(self.root / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.root / "no-aws-credentials"),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.env)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kcache.cli", "serve", "--host", HOST, "--port", str(self.port)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 60) -> KcacheService:
        import httpx

        wait_until(
            f"kcache serve :{self.port}",
            lambda: httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200,
            timeout, self.proc, self.log,
        )
        return self

    def stop(self) -> None:
        kill(self.proc, signal.SIGTERM)
        self.proc = None

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


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
