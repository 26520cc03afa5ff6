"""Real storage servers on loopback: SeaweedFS (S3), Redis, a Redis Cluster, each on ports picked
free at start, so parallel runs on one machine never collide. Tests get session-wide ones through
tests/servers.py; benchmarks start their own."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from kcache_testkit.pace import HANG_S
from kcache_testkit.ports import HOST, free_ports, kill, wait_until

S3_ACCESS_KEY = "kcache-test-access"
S3_SECRET_KEY = "kcache-test-secret-0123456789abcdef"
S3_REGION = "us-east-1"


# ---- small utilities ------------------------------------------------------------------------


def binary(name: str) -> str:
    """Path of a server binary. Under pytest a missing one skips the test (fails it with
    KCACHE_TEST_SERVERS=require, as CI runs); elsewhere (benchmarks) it raises."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    msg = f"{name} not found on PATH (needed for the real-server tests)"
    if "pytest" not in sys.modules:
        raise FileNotFoundError(msg)
    import pytest

    if os.environ.get("KCACHE_TEST_SERVERS") == "require":
        pytest.fail(msg)
    pytest.skip(msg)


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# ---- SeaweedFS ---------------------------------------------------------------------------------


class _OwnedServer:
    """A server process we started (not daemonized: we hold its pid), for tests that kill,
    freeze and thaw their backends."""

    proc: subprocess.Popen[bytes] | None = None

    def stop(self, sig: int = signal.SIGKILL) -> None:
        kill(self.proc, sig)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


class SeaweedFS(_OwnedServer):
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

    def start(self, timeout: float = HANG_S) -> SeaweedFS:
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

    def wait_writable(self, bucket: str, timeout: float = HANG_S) -> None:
        """Wait until an object can be written: the volume server registers after the S3 port opens."""
        client = self.client()
        wait_until(
            "SeaweedFS writes",
            lambda: client.put_object(Bucket=bucket, Key=".kcache-probe", Body=b"ok") is not None,
            timeout, self.proc, self.log,
        )

    def wait_serving(self, bucket: str, timeout: float = HANG_S) -> None:
        """Wait until objects can be written and read back (volume servers registered)."""
        client = self.client()
        self.wait_writable(bucket, timeout)
        wait_until(
            "SeaweedFS reads",
            lambda: client.get_object(Bucket=bucket, Key=".kcache-probe")["Body"].read() == b"ok",
            timeout, self.proc, self.log,
        )

    def restart(self, timeout: float = HANG_S) -> None:
        self.stop()
        self.start(timeout)

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


class RedisServer(_OwnedServer):
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

    def start(self, timeout: float = HANG_S) -> RedisServer:
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

    def restart(self) -> None:
        self.stop()
        self.start()



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

    def start(self, timeout: float = HANG_S) -> RedisClusterServers:
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


