"""A fleet starts at once: M fresh nodes prefetch one workload from the service tier (issue #31).

Each simulated node does what kcache's prefetch does on a fresh node (``kcache.transport.workload``): its
``--procs`` processes (ranks) each read the workload's manifest, one of them (the node's claim
holder) downloads the kernel packs and cache entries, the others read them from the node's local
tier (``tests/test_node_fetch_once.py`` proves real processes do that). The downloads are the
client's: packs in one ``kernels:batch-get`` (or, where the service hands out presigned URLs,
one ``kernels:batch-urls`` and 8 object-store GETs at a time), entries 8 GETs at a time (or, with
presigned URLs, one ``entries:batch-urls`` and 8 object-store GETs at a time); with the client's retry rule (one retry after a connection error or
a 5xx). Nodes are asyncio tasks of this process, each with its own connection pools (an httpx
``AsyncClient`` per node and store), so hundreds fit on 2 cores; every byte received is checked
against the sha256 of what was stored. A node is warm when every pack and entry arrived. What
arrives is not written to disk. The clients wait for answers (30 s connect, 60 s read) and each
request is then held to kcache's client deadlines (``KCACHE_CONNECT_TIMEOUT_S`` 0.5 s +
``KCACHE_READ_TIMEOUT_S`` 2 s, stretched at 1 MiB/s for a body): past them it counts as a
request the client would have failed open on. Hundreds of clients on one event loop wait for
the loop too (its lag is reported), so that count is an upper bound; ``--client-deadlines``
makes the simulated clients give up there for real.

The workload has the shape of one measured on an H100 (``--profile``; bench/results/gpu/h100):
``gpt2-train`` (46 kernel packs, 0.84 MB; 19 entries, 7.97 MB: 4 FX-graph, 2 AOTAutograd, a
Triton host module, 12 autotune) or ``gpt2-autotune`` (171 packs, 13.3 MB; 12 entries, 135.6 MB).
Packs are real kernels of the bench corpus (compiled on the CPU, cached in bench/.corpus) whose
``.cubin`` is replaced by random bytes, so each pack has the measured mean size; entries are
random bytes of the measured sizes.

Setups (``--setups``), each a real ``kcache serve --workers W`` (``--replicas`` of them over S3,
nodes spread over them round-robin, as a load balancer does):

* ``embedded``: one replica over its embedded default, files + SQLite;
* ``s3``: SeaweedFS (S3) + Redis, presigned downloads off: every byte through the API tier;
* ``s3-presigned``: the same with ``KCACHE_PRESIGNED_DOWNLOADS=true``: the API tier answers the
  manifest, one URL list and a redirect per entry; the bytes come from S3;
* ``s3-direct``: the limit: every node GETs the same presigned URLs straight from S3 (taken
  from the service once, before the burst), no API tier at all.

For each setup, in this order: an unloaded node (median of ``--baseline-repeats``; the reference
for every ratio), the burst (``--nodes`` nodes started together), and, with ``--ramp-load F``,
``F`` x ``--nodes`` nodes arriving evenly at ``F`` x the node rate the burst reached (a fleet
that starts over the burst's time, at a load the tier sustains). Per phase:
time to warm per node (p50/p90/p99/max, and each over the unloaded node's), nodes/s and MB/s,
errors by kind, items lost or corrupt, and per node start: API-tier CPU ms (every process of
the replicas), Redis commands (``INFO commandstats``), S3 requests (SeaweedFS's own counters),
bytes through the API tier and from S3; the replicas' peak RSS (``VmHWM``, reset before the
phase), Redis's and SeaweedFS's CPU, this driver's CPU (the clients share the 2 cores).

``--real-nodes R`` (after the embedded burst and after the s3-presigned one) also starts R real
nodes of ``--procs`` real interpreters each (own HOME and TMPDIR per node; activated by
``KCACHE_URL`` and ``KCACHE_WORKLOAD`` as a user's job is: the ``.pth`` hook starts the real
prefetcher), all at once, and compares the bytes the service sent per node with one real node
of one process, and with a simulated node.

    python -m bench.fleet_burst [--nodes 200] [--procs 8] [--replicas 2] [--workers 1]
        [--profile gpt2-train] [--setups embedded,s3,s3-presigned,s3-direct] [--ramp-load 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from kcache_schemas import wire

from bench import common
from kcache_testkit.nodes import Node
from kcache_testkit.ports import HOST, free_port
from kcache_testkit.service import ServerProcess, server_env
from kcache_testkit.storage_servers import RedisServer, SeaweedFS

NS = "fleet"
WORKLOAD = "fleet-burst"
MB = 1e6
BUCKET = "kcache-fleet"
_TAR_BLOCK = 512
_ENTRY_FETCHES = 8  # kcache.transport.workload: entries (and presigned packs) 8 at a time
# A body must flow at this rate to earn time beyond the deadline (kcache.transport.http._MIN_RATE).
_MIN_RATE = 1 << 20


# ---- the workload -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Profile:
    """A workload's shape as measured on an H100 (bench/results/gpu/h100, the prefetch counts)."""

    kernels: int
    kernel_bytes: int
    entries: tuple[tuple[str, int, int], ...]  # (layer, count, total bytes)
    source: str


PROFILES = {
    # f5_gpt2train_final.json, kcache-prefetch: 46 kernels 840,957 B; 19 entries 7,974,740 B
    # (fx-graph 4 hits 6,676,639 B, aot-autograd 2 hits 1,263,055 B, triton-module 1 31,944 B;
    # the 12 autotune entries are the remaining 3,102 B).
    "gpt2-train": Profile(46, 840_957, (("fx-graph", 4, 6_676_639), ("aot-autograd", 2, 1_263_055),
                                        ("triton-module", 1, 31_944), ("autotune", 12, 3_102)),
                          "H100, torch 2.11, GPT-2 6-layer train step, default mode"),
    # f3_gpt2autotune_final.json: 171 kernels 13,343,212 B; 12 entries 135,648,223 B (one
    # FX-graph entry of 135,308,240 B, aot-autograd 305,900 B, triton-module 31,944 B, and 9
    # autotune entries, 2,139 B).
    "gpt2-autotune": Profile(171, 13_343_212, (("fx-graph", 1, 135_308_240), ("aot-autograd", 1, 305_900),
                                               ("triton-module", 1, 31_944), ("autotune", 9, 2_139)),
                             "H100, torch 2.11, GPT-2 6-layer inference, max-autotune-no-cudagraphs"),
}


@dataclasses.dataclass
class Workload:
    packs: dict[str, bytes]  # kernel key -> pack
    entries: dict[tuple[str, str], bytes]  # (layer, key) -> bytes

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.packs.values())) + sum(map(len, self.entries.values()))

    def digests(self) -> dict[tuple[str, str], str]:
        out = {("kernel", k): hashlib.sha256(v).hexdigest() for k, v in self.packs.items()}
        out |= {ref: hashlib.sha256(v).hexdigest() for ref, v in self.entries.items()}
        return out


def _sized_pack(kdir: Path, target: int, seed: int) -> bytes:
    """A valid pack of the kernel in ``kdir``, about ``target`` bytes long: its ``.cubin`` is
    random bytes (they do not compress), the other files are the real ones."""
    from kcache_schemas.pack import build_pack, manifest_for_files, read_kernel_dir

    files = read_kernel_dir(kdir)
    cubin = next(n for n in files if n.endswith(".cubin"))
    rng = random.Random(seed)

    def pack(size: int) -> bytes:
        files[cubin] = rng.randbytes(max(256, size))
        return bytes(build_pack(manifest_for_files(kdir.name, files), files, level=3))

    size = target
    data = pack(size)
    for _ in range(3):  # the other files take some room too: converge on the target
        size += target - len(data)
        data = pack(size)
    return data


def make_workload(profile: Profile) -> Workload:
    # The bench corpus's first kernels (compiled once into bench/.corpus, then cached).
    dirs = common.corpus_dirs(profile.kernels)
    mean = profile.kernel_bytes // profile.kernels
    packs = {d.name: _sized_pack(d, mean, seed=i) for i, d in enumerate(dirs)}
    rng = random.Random(31)
    entries: dict[tuple[str, str], bytes] = {}
    for layer, count, total in profile.entries:
        for i in range(count):
            size = total // count + (total % count if i == 0 else 0)
            entries[(layer, f"fleet-{layer}-{i:02d}")] = rng.randbytes(size)
    return Workload(packs, entries)


def node_fingerprint(root: Path) -> dict[str, Any]:
    """The environment fingerprint a job interpreter computes (what it asks the workload for)."""
    env = Node(root / "fingerprint").env()
    out = subprocess.run([sys.executable, "-c", "from kcache.store.fingerprint import current; print(current().model_dump_json())"],
                         env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def publish(url: str, workload: Workload, fingerprint: dict[str, Any]) -> str:
    """Store the packs and entries through one replica, then the manifest; the fingerprint id."""
    from concurrent.futures import ThreadPoolExecutor

    from kcache_schemas.pack import MEDIA_TYPE

    with httpx.Client(base_url=url, timeout=120) as c:
        def put(item: tuple[str, str, bytes]) -> None:
            layer, key, data = item
            if layer == "kernel":
                r = c.put(f"/v1/{NS}/kernels/{key}", content=data, headers={"Content-Type": MEDIA_TYPE})
            else:
                r = c.put(f"/v1/{NS}/entries/{layer}/{key}", content=data,
                          headers={"Content-Type": "application/octet-stream", wire.COMPILE_TIME: "3.0"})
            assert r.status_code in (200, 201), r.text

        items = [("kernel", k, v) for k, v in workload.packs.items()] + [(la, k, v) for (la, k), v in workload.entries.items()]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(put, items))
        manifest = {"name": WORKLOAD, "fingerprint": fingerprint, "kernels": sorted(workload.packs),
                    "entries": [{"layer": la, "key": k} for la, k in sorted(workload.entries)]}
        r = c.put(f"/v1/{NS}/workloads/{WORKLOAD}", json=manifest)
        assert r.status_code in (200, 201), r.text
        return str(r.json()["fingerprint"])


# ---- one simulated node ----------------------------------------------------------------------


@dataclasses.dataclass
class Deadlines:
    """Request deadlines of the simulated clients, and the client's own (kcache.config's
    defaults) that each request's time is held to afterwards.

    The clients of hundreds of nodes share this one process's event loop and two cores with
    the service: a request's time here includes waiting for the loop, which a real node's own
    CPU would not add. So by default the simulated clients wait patiently (what the tier
    answers, and how fast, is measured) and each request is then counted as over the client's
    deadlines or not; ``--client-deadlines`` applies the client's deadlines for real instead."""

    connect_s: float
    read_s: float
    retries: int
    client_connect_s: float
    client_read_s: float

    @classmethod
    def make(cls, client_deadlines: bool) -> Deadlines:
        from kcache.config import ClientConfig

        c = ClientConfig()
        if client_deadlines:
            return cls(c.connect_timeout_s, c.read_timeout_s, c.retries, c.connect_timeout_s, c.read_timeout_s)
        return cls(30.0, 60.0, c.retries, c.connect_timeout_s, c.read_timeout_s)

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.read_s, connect=self.connect_s, pool=None)

    def over_client(self, seconds: float, nbytes: int) -> bool:
        """Past what kcache's client allows a request (connect + read, stretched for a body
        flowing at 1 MiB/s): it would have failed open there."""
        return seconds > self.client_connect_s + self.client_read_s + nbytes / _MIN_RATE


@dataclasses.dataclass
class NodeResult:
    seconds: float = 0.0
    got: int = 0
    lost: int = 0
    corrupt: int = 0
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    api_requests: int = 0
    api_bytes: int = 0
    s3_requests: int = 0
    s3_bytes: int = 0
    request_s: list[float] = dataclasses.field(default_factory=list)
    over_client_deadline: int = 0


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """What every simulated node of a setup is told (picklable: driver processes make nodes)."""

    urls: tuple[str, ...]  # replicas, node i talks to urls[i % len]; none: straight to S3
    fingerprint: str
    procs: int
    want: dict[tuple[str, str], str]
    deadlines: Deadlines
    direct: dict[tuple[str, str], str] | None = None
    entry_gets: bool = False  # entries by one redirected GET each, as clients before entries:batch-urls

    def node(self, i: int) -> SimNode:
        return SimNode(self.urls[i % len(self.urls)] if self.urls else None, self.fingerprint, self.procs,
                       self.want, self.deadlines, self.direct, self.entry_gets)


class _Fetch(Exception):
    """A request that failed for good (after the client's retries), by kind."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _status_kind(status: int, body: bytes) -> str:
    """``http_<status>``, with the service's error code where the body has one."""
    from kcache_schemas.error_codes import ErrorBody

    err = ErrorBody.parse(body)
    return f"http_{status}_{err.error.code}" if err is not None else f"http_{status}"


def _error_kind(exc: BaseException) -> str:
    for cls, kind in ((httpx.ConnectTimeout, "connect_timeout"), (httpx.ReadTimeout, "read_timeout"),
                      (httpx.WriteTimeout, "write_timeout"), (httpx.PoolTimeout, "pool_timeout"),
                      (httpx.ConnectError, "connect_error"), (httpx.RemoteProtocolError, "protocol_error"),
                      (httpx.ReadError, "read_error"), (httpx.WriteError, "write_error")):
        if isinstance(exc, cls):
            return kind
    return type(exc).__name__


class SimNode:
    """One fresh node's prefetch over the wire, as kcache.transport.workload does it."""

    def __init__(self, api_url: str | None, fingerprint: str, procs: int, want: dict[tuple[str, str], str],
                 deadlines: Deadlines, direct: dict[tuple[str, str], str] | None = None, entry_gets: bool = False) -> None:
        self.api_url, self.fingerprint, self.procs, self.want = api_url, fingerprint, procs, want
        self.deadlines, self.direct, self.entry_gets = deadlines, direct, entry_gets
        self.r = NodeResult()

    async def run(self) -> NodeResult:
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=8)  # kcache.transport.http's pool
        t0 = time.perf_counter()
        async with httpx.AsyncClient(base_url=self.api_url or "", timeout=self.deadlines.timeout(), limits=limits,
                                     follow_redirects=True) as api, \
                httpx.AsyncClient(timeout=self.deadlines.timeout(), limits=limits) as blob:
            self.api_host = httpx.URL(self.api_url).netloc if self.api_url else b""
            if self.direct is not None:
                await self._gather_bounded([self._object(blob, ref, url) for ref, url in self.direct.items()])
            else:
                await self._prefetch(api, blob)
        self.r.seconds = time.perf_counter() - t0
        self.r.lost = len(self.want) - self.r.got - self.r.corrupt
        return self.r

    async def _prefetch(self, api: httpx.AsyncClient, blob: httpx.AsyncClient) -> None:
        views = await asyncio.gather(*(self._view(api) for _ in range(self.procs)), return_exceptions=True)
        first = views[0]
        if isinstance(first, BaseException):
            return  # the node's prefetch found no manifest: every item lost (counted)
        view, presigned = first
        kernels = list(view["kernels"])
        try:
            if presigned:
                urls = await self._json(api, "POST", f"/v1/{NS}/kernels:batch-urls", {"keys": kernels})
                await self._gather_bounded([self._object(blob, ("kernel", k), u) for k, u in urls["urls"].items()])
                if urls["inline"]:
                    await self._batch_get(api, urls["inline"])
            else:
                await self._batch_get(api, kernels)
        except _Fetch:
            pass  # counted; the real prefetch goes on with the entries
        refs = [(e["layer"], e["key"]) for e in view["entries"]]
        if presigned and refs and not self.entry_gets:
            try:
                body = {"entries": [{"layer": layer, "key": key} for layer, key in refs]}
                answer = await self._json(api, "POST", f"/v1/{NS}/entries:batch-urls", body)
                urls = {(u["layer"], u["key"]): u["url"] for u in answer["urls"]}
                await self._gather_bounded([self._object(blob, ref, url) for ref, url in urls.items()])
                refs = [ref for ref in refs if ref not in urls]
            except _Fetch:
                pass  # counted; the real prefetch then GETs each entry
        await self._gather_bounded([self._entry(api, ref) for ref in refs])

    async def _gather_bounded(self, jobs: Sequence[Awaitable[None]]) -> None:
        gate = asyncio.Semaphore(_ENTRY_FETCHES)

        async def one(job: Awaitable[None]) -> None:
            async with gate:
                with contextlib.suppress(_Fetch):
                    await job

        await asyncio.gather(*(one(j) for j in jobs))

    async def _request(self, client: httpx.AsyncClient, method: str, url: str, *, retry: bool = True,
                       **kw: Any) -> tuple[httpx.Response, bytes]:
        """One request with the client's retry rule and body deadline; the body read whole."""
        attempts = 1 + (self.deadlines.retries if retry else 0)
        kind = "unknown"
        for attempt in range(attempts):
            started = time.monotonic()
            deadline = started + self.deadlines.connect_s + self.deadlines.read_s
            try:
                async with client.stream(method, url, **kw) as resp:
                    chunks, received = [], 0
                    async for chunk in resp.aiter_bytes():
                        received += len(chunk)
                        if time.monotonic() > deadline + received / _MIN_RATE:
                            raise httpx.ReadTimeout("body too slow")
                        chunks.append(chunk)
                self._timed(time.monotonic() - started, received)
                self._count(resp, received)
                if resp.status_code < 500:
                    if resp.status_code >= 400:
                        kind = _status_kind(resp.status_code, b"".join(chunks))
                        self.r.errors[kind] += 1
                        raise _Fetch(kind)
                    return resp, b"".join(chunks)
                kind = _status_kind(resp.status_code, b"".join(chunks))
                self.r.errors[kind] += 1
            except httpx.HTTPError as exc:
                kind = _error_kind(exc)
                self.r.errors[kind] += 1
                if isinstance(exc, httpx.TimeoutException):
                    break
            if attempt + 1 < attempts:
                await asyncio.sleep(0.05 * 2**attempt)
        raise _Fetch(kind)

    def _timed(self, seconds: float, nbytes: int) -> None:
        self.r.request_s.append(seconds)
        if self.deadlines.over_client(seconds, nbytes):
            self.r.over_client_deadline += 1

    def _count(self, resp: httpx.Response, body: int) -> None:
        for hop in [*resp.history, resp]:
            size = body if hop is resp else 0
            if hop.url.netloc == self.api_host:
                self.r.api_requests += 1
                self.r.api_bytes += size
            else:
                self.r.s3_requests += 1
                self.r.s3_bytes += size

    async def _view(self, api: httpx.AsyncClient) -> tuple[dict[str, Any], bool]:
        resp, body = await self._request(api, "GET", f"/v1/{NS}/workloads/{WORKLOAD}", params={"fingerprint": self.fingerprint})
        return json.loads(body), resp.headers.get(wire.DOWNLOADS) == wire.DOWNLOADS_PRESIGNED

    async def _json(self, api: httpx.AsyncClient, method: str, path: str, body: Any) -> Any:
        _resp, data = await self._request(api, method, path, json=body)
        return json.loads(data)

    def _check(self, ref: tuple[str, str], data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() == self.want.get(ref):
            self.r.got += 1
        else:
            self.r.corrupt += 1

    async def _object(self, blob: httpx.AsyncClient, ref: tuple[str, str], url: str) -> None:
        _resp, data = await self._request(blob, "GET", url)
        self._check(ref, data)

    async def _entry(self, api: httpx.AsyncClient, ref: tuple[str, str]) -> None:
        _resp, data = await self._request(api, "GET", f"/v1/{NS}/entries/{ref[0]}/{ref[1]}")
        self._check(ref, data)

    async def _batch_get(self, api: httpx.AsyncClient, keys: list[str]) -> None:
        """The tar stream, parsed as it arrives; as kcache.transport.http.batch_get, a dropped connection
        or a 5xx is retried once for the packs that did not arrive, a timeout is not."""
        todo = list(keys)
        for attempt in range(1 + self.deadlines.retries):
            got: set[str] = set()
            retry = await self._batch_get_once(api, todo, got)
            todo = [k for k in todo if k not in got]
            if not retry or not todo:
                return
            if attempt < self.deadlines.retries:
                await asyncio.sleep(0.05 * 2**attempt)

    async def _batch_get_once(self, api: httpx.AsyncClient, keys: list[str], got: set[str]) -> bool:
        """One batch-get; whether it failed in a way the client retries."""
        started = time.monotonic()
        try:
            async with api.stream("POST", f"/v1/{NS}/kernels:batch-get", json={"keys": keys}) as resp:
                if resp.status_code >= 400:
                    body = await resp.aread()
                    self._count(resp, len(body))
                    self.r.errors[_status_kind(resp.status_code, body)] += 1
                    return resp.status_code >= 500
                parser = _TarReader()
                received = 0
                try:
                    async for chunk in resp.aiter_raw():
                        received += len(chunk)
                        for name, data in parser.feed(chunk):
                            if name.endswith(".kpack"):
                                key = name[: -len(".kpack")]
                                got.add(key)
                                self._check(("kernel", key), data)
                finally:
                    self._count(resp, received)
                # No body deadline in the client's batch-get (it streams): only a first byte
                # later than connect + read would have failed there; this counts the whole.
                self._timed(time.monotonic() - started, received)
                return False
        except httpx.HTTPError as exc:
            self.r.errors[_error_kind(exc)] += 1
            return not isinstance(exc, httpx.TimeoutException)


class _TarReader:
    """Members of an uncompressed tar stream as its bytes arrive (ustar and PAX headers)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pax_name: str | None = None
        self.done = False

    def feed(self, chunk: bytes) -> Iterator[tuple[str, bytes]]:
        self.buf += chunk
        while not self.done and len(self.buf) >= _TAR_BLOCK:
            header = bytes(self.buf[:_TAR_BLOCK])
            if header == bytes(_TAR_BLOCK):
                self.done = True
                return
            size = int(header[124:136].strip(b"\0 ") or b"0", 8)
            padded = size + (-size % _TAR_BLOCK)
            if len(self.buf) < _TAR_BLOCK + padded:
                return
            data = bytes(self.buf[_TAR_BLOCK : _TAR_BLOCK + size])
            del self.buf[: _TAR_BLOCK + padded]
            kind = header[156:157]
            if kind in (b"x", b"g"):
                for record in data.decode().splitlines():
                    if " path=" in record:
                        self.pax_name = record.split(" path=", 1)[1]
                continue
            name = self.pax_name or header[:100].rstrip(b"\0").decode()
            self.pax_name = None
            yield name, data


# ---- measuring the tier -----------------------------------------------------------------------


def _session_pids(leader: int) -> list[int]:
    """Every live process of the session ``leader`` started (a server started in its own
    session: uvicorn's workers, weed's one process)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == leader:  # field 6 of stat: the session id
                out.append(int(stat.parent.name))
    return out


def _cpu_s(pids: Sequence[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _status_kib(pid: int, field: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Tier:
    """The processes of one setup (replicas, Redis, SeaweedFS) and their counters."""

    def __init__(self, replicas: Sequence[ServerProcess], redis: RedisServer | None, weed: WeedWithMetrics | None) -> None:
        self.replicas, self.redis, self.weed = list(replicas), redis, weed

    def replica_pids(self) -> list[int]:
        return [p for r in self.replicas if r.proc is not None for p in _session_pids(r.proc.pid)]

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = {"api_cpu_s": _cpu_s(self.replica_pids()), "driver_cpu_s": _driver_cpu_s(), "t": time.perf_counter()}
        if self.redis is not None:
            snap |= _redis_counts(self.redis.port)
        if self.weed is not None and self.weed.proc is not None:
            snap["s3_cpu_s"] = _cpu_s(_session_pids(self.weed.proc.pid))
            snap["s3_requests"], snap["s3_sent_bytes"] = self.weed.counters()
        return snap

    def reset_peaks(self) -> dict[int, int]:
        idle = {}
        for pid in self.replica_pids():
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := current RSS
                idle[pid] = _status_kib(pid, "VmRSS")
        return idle

    def peaks(self, idle: dict[int, int]) -> dict[str, float]:
        pids = self.replica_pids()
        hwm = {pid: _status_kib(pid, "VmHWM") for pid in pids}
        return {
            "replica_processes": len(pids),
            "idle_rss_mib_max": round(max(idle.values(), default=0) / 1024, 1),
            "peak_rss_mib_max": round(max(hwm.values(), default=0) / 1024, 1),
            "peak_growth_mib_max": round(max((hwm[p] - idle.get(p, hwm[p]) for p in pids), default=0) / 1024, 1),
            "peak_rss_mib_sum": round(sum(hwm.values()) / 1024, 1),
        }


def _driver_cpu_s() -> float:
    """This process and its reaped children (the driver processes of finished phases)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _redis_counts(port: int) -> dict[str, Any]:
    import redis

    client = redis.Redis(host=HOST, port=port)
    try:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
        mem = client.info("memory")
    finally:
        client.close()
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    calls.pop("info", None)  # ours
    return {"redis_calls": calls, "redis_cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            "redis_used_memory_mb": round(int(mem["used_memory"]) / MB, 2)}


_S3_REQ = re.compile(r'^SeaweedFS_s3_request_total\{([^}]*)\} ([0-9.e+]+)$', re.MULTILINE)
_S3_SENT = re.compile(r'^SeaweedFS_s3_bucket_traffic_sent_bytes_total\{[^}]*\} ([0-9.e+]+)$', re.MULTILINE)


class WeedWithMetrics(SeaweedFS):
    """``weed mini`` with its Prometheus port open: S3 requests counted by SeaweedFS itself."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return [*super().command(), f"-metricsPort={self.metrics_port}", f"-metricsIp={HOST}"]

    def counters(self) -> tuple[dict[str, int], int]:
        """S3 requests by type (``GET``, ``PUT``, ``HEAD``, ...; all buckets and codes), and the
        body bytes S3 sent."""
        text = httpx.get(f"http://{HOST}:{self.metrics_port}/metrics", timeout=10).text
        out: Counter[str] = Counter()
        for labels, value in _S3_REQ.findall(text):
            kind = dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("type", "?")
            out[kind] += int(float(value))
        sent = sum(int(float(v)) for v in _S3_SENT.findall(text))
        return dict(out), sent


# What the replicas' access recorders send (kcache_server.store.AccessRecorder: every
# KCACHE_ACCESS_FLUSH_S, one script touching each key read since, EXISTS + HINCRBY + HGET + HSET
# per key): bounded by the keys read and the replicas, not by the requests; counted apart.
_FLUSH_COMMANDS = frozenset({"evalsha", "eval", "exists", "hincrby", "hget", "hset"})


def _delta(before: dict[str, Any], after: dict[str, Any], nodes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    n = max(nodes, 1)
    out["api_cpu_ms_per_node"] = round((after["api_cpu_s"] - before["api_cpu_s"]) * 1000 / n, 2)
    out["api_cpu_s"] = round(after["api_cpu_s"] - before["api_cpu_s"], 2)
    out["driver_cpu_s"] = round(after["driver_cpu_s"] - before["driver_cpu_s"], 2)
    if "redis_calls" in after:
        calls = {k: v - before["redis_calls"].get(k, 0) for k, v in after["redis_calls"].items()}
        calls = {k: v for k, v in calls.items() if v}
        flush = sum(v for k, v in calls.items() if k in _FLUSH_COMMANDS)
        out["redis_commands_per_node"] = round((sum(calls.values()) - flush) / n, 2)
        out["redis_flush_commands_per_s"] = round(flush / max(after["t"] - before["t"], 1e-9), 1)
        out["redis_commands_by_name"] = dict(sorted(calls.items(), key=lambda kv: -kv[1]))
        out["redis_cpu_ms_per_node"] = round((after["redis_cpu_s"] - before["redis_cpu_s"]) * 1000 / n, 3)
        out["redis_used_memory_mb"] = after["redis_used_memory_mb"]
    if "s3_requests" in after:
        reqs = {k: v - before["s3_requests"].get(k, 0) for k, v in after["s3_requests"].items()}
        reqs = {k: v for k, v in reqs.items() if v}
        out["s3_requests_per_node"] = round(sum(reqs.values()) / n, 2)
        out["s3_requests_by_type"] = reqs
        out["s3_cpu_ms_per_node"] = round((after["s3_cpu_s"] - before["s3_cpu_s"]) * 1000 / n, 2)
        out["s3_sent_mb_per_node"] = round((after["s3_sent_bytes"] - before["s3_sent_bytes"]) / MB / n, 3)
    return out


# ---- phases ----------------------------------------------------------------------------------


def _pct(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile by the nearest rank (p99 of 200 nodes is the third slowest)."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _run_nodes(spec: NodeSpec, nodes: Sequence[int], start_at: float, rate: float | None,
                     ) -> tuple[list[tuple[int, NodeResult]], float, list[float]]:
    """Run ``nodes`` (their indices), node i starting at ``start_at`` (wall clock) + i / ``rate``
    (all at ``start_at`` without a rate); ((i, result)..., wall clock at the end, this event
    loop's lag: how late a 20 ms timer fired, sampled throughout)."""
    lags: list[float] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - t - 0.02)

    async def start(i: int) -> tuple[int, NodeResult]:
        await asyncio.sleep(max(0.0, start_at + (i / rate if rate else 0.0) - time.time()))
        return i, await spec.node(i).run()

    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(*(start(i) for i in nodes))
    done.set()
    await watcher
    return list(results), time.time(), lags


def _drive(spec: NodeSpec, nodes: Sequence[int], start_at: float, rate: float | None,
           ) -> tuple[list[tuple[int, NodeResult]], float, list[float]]:
    """One driver process: its share of the nodes on its own event loop."""
    return asyncio.run(_run_nodes(spec, nodes, start_at, rate))


def drive(spec: NodeSpec, count: int, rate: float | None, drivers: int) -> tuple[list[NodeResult], float, list[float]]:
    """``count`` nodes over ``drivers`` processes (node i in process i % drivers), started
    together; (results in node order, wall s, every driver's loop lags)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    drivers = max(1, min(drivers, count))
    with ProcessPoolExecutor(drivers, mp_context=get_context("fork")) as pool:
        start_at = time.time() + 1.0  # every driver is up by then
        futures = [pool.submit(_drive, spec, range(k, count, drivers), start_at, rate) for k in range(drivers)]
        parts = [f.result() for f in futures]
    results = sorted((pair for part in parts for pair in part[0]), key=lambda pair: pair[0])
    wall = max(part[1] for part in parts) - start_at
    return [r for _i, r in results], wall, [lag for part in parts for lag in part[2]]


def summarize(results: Sequence[NodeResult], wall: float, unloaded: float | None, workload_bytes: int,
              lags: Sequence[float] = ()) -> dict[str, Any]:
    times = [r.seconds for r in results]
    requests = [t for r in results for t in r.request_s]
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r.errors)
    n = len(results)
    out: dict[str, Any] = {
        "nodes": n,
        "wall_s": round(wall, 2),
        "nodes_per_s": round(n / wall, 2),
        "warm_s": {"p50": round(_pct(times, 0.50), 3), "p90": round(_pct(times, 0.90), 3),
                   "p99": round(_pct(times, 0.99), 3), "max": round(max(times), 3)},
        "errors": dict(errors),
        "http_5xx": sum(v for k, v in errors.items() if k.startswith("http_5")),
        "items_lost": sum(r.lost for r in results),
        "items_corrupt": sum(r.corrupt for r in results),
        "nodes_complete": sum(1 for r in results if r.lost == 0 and r.corrupt == 0),
        "api_requests_per_node": round(sum(r.api_requests for r in results) / n, 2),
        "api_mb_per_node": round(sum(r.api_bytes for r in results) / n / MB, 3),
        "s3_requests_per_node_client": round(sum(r.s3_requests for r in results) / n, 2),
        "s3_mb_per_node_client": round(sum(r.s3_bytes for r in results) / n / MB, 3),
        "delivered_mb_per_s": round(sum(r.api_bytes + r.s3_bytes for r in results) / wall / MB, 1),
        "workload_mb": round(workload_bytes / MB, 3),
        "request_s": {"p50": round(_pct(requests, 0.5), 3), "p99": round(_pct(requests, 0.99), 3),
                      "max": round(max(requests), 3)} if requests else {},
        # Requests that took longer than kcache's client allows (it would have failed open on
        # them, and the node compiled what they carried): an upper bound, see Deadlines.
        "requests_over_client_deadline": sum(r.over_client_deadline for r in results),
        "requests": len(requests),
        "driver_loop_lag_s": {"p50": round(_pct(lags, 0.5), 3), "p99": round(_pct(lags, 0.99), 3),
                              "max": round(max(lags), 3)} if lags else {},
    }
    if unloaded:
        out["vs_unloaded"] = {k: round(v / unloaded, 2) for k, v in out["warm_s"].items()}
    return out


def run_phase(tier: Tier, spec: NodeSpec, count: int, rate: float | None, unloaded: float | None,
              workload_bytes: int, drivers: int) -> dict[str, Any]:
    idle = tier.reset_peaks()
    before = tier.snapshot()
    results, wall, lags = drive(spec, count, rate, drivers)
    after = tier.snapshot()
    out = summarize(results, wall, unloaded, workload_bytes, lags)
    out |= _delta(before, after, count)
    out["api_tier_memory"] = tier.peaks(idle)
    if rate:
        out["arrival_rate_nodes_per_s"] = round(rate, 2)
    return out


def run_setup(name: str, tier: Tier, urls: Sequence[str], fingerprint: str, want: dict[tuple[str, str], str],
              args: argparse.Namespace, workload_bytes: int, direct: dict[tuple[str, str], str] | None = None) -> dict[str, Any]:
    spec = NodeSpec(tuple(urls), fingerprint, args.procs, want, Deadlines.make(args.client_deadlines), direct, args.entry_gets)
    asyncio.run(spec.node(0).run())  # warm-up: connections, page cache, the replicas' first requests
    singles = [asyncio.run(spec.node(0).run()) for _ in range(args.baseline_repeats)]
    unloaded = statistics.median(r.seconds for r in singles)
    base = summarize(singles, sum(r.seconds for r in singles), None, workload_bytes)
    res: dict[str, Any] = {"unloaded": {"warm_s_median": round(unloaded, 4), "repeats": args.baseline_repeats,
                                        "api_requests_per_node": base["api_requests_per_node"],
                                        "api_mb_per_node": base["api_mb_per_node"],
                                        "s3_mb_per_node_client": base["s3_mb_per_node_client"],
                                        "errors": base["errors"], "items_lost": base["items_lost"]}}
    print(f"[{name}] unloaded node: {unloaded * 1000:.1f} ms", flush=True)
    res["burst"] = run_phase(tier, spec, args.nodes, None, unloaded, workload_bytes, args.drivers)
    _print_phase(name, "burst", res["burst"])
    if args.ramp_load > 0:
        rate = res["burst"]["nodes_per_s"] * args.ramp_load
        res["ramp"] = run_phase(tier, spec, max(1, int(args.nodes * args.ramp_load)), rate, unloaded, workload_bytes, args.drivers)
        _print_phase(name, f"ramp {rate:.1f}/s", res["ramp"])
    return res


def _print_phase(setup: str, phase: str, r: dict[str, Any]) -> None:
    w, v = r["warm_s"], r.get("vs_unloaded", {})
    print(f"[{setup}] {phase}: {r['nodes']} nodes in {r['wall_s']} s ({r['nodes_per_s']} nodes/s, "
          f"{r['delivered_mb_per_s']} MB/s); warm p50 {w['p50']} s ({v.get('p50')}x) p99 {w['p99']} s ({v.get('p99')}x); "
          f"5xx {r['http_5xx']}, errors {r['errors']}, lost {r['items_lost']}, corrupt {r['items_corrupt']}, "
          f"over client deadline {r['requests_over_client_deadline']}/{r['requests']} (driver loop lag p99 {r['driver_loop_lag_s'].get('p99')} s); "
          f"API {r['api_cpu_ms_per_node']} CPU ms/node, {r['api_mb_per_node']} MB/node; "
          f"Redis {r.get('redis_commands_per_node', '-')} cmd/node; S3 {r.get('s3_requests_per_node', '-')} req/node; "
          f"peak RSS {r['api_tier_memory']['peak_rss_mib_max']} MiB", flush=True)


# ---- real nodes -------------------------------------------------------------------------------

REAL_JOB = """
import json, sys
from kcache.current import get_runtime
rt = get_runtime()
p = rt.prefetcher if rt is not None else None
if p is None:
    print(json.dumps({"error": "no prefetcher"})); sys.exit(1)
p.done.wait(300)
print(json.dumps({"following": p.following, "counts": p.counts, "seconds": round(p.seconds, 3)}))
"""

_SENT = re.compile(r'^kcache_bytes_sent_total\{layer="([^"]+)"\} ([0-9.e+]+)$', re.MULTILINE)


def _bytes_sent(urls: Sequence[str]) -> int:
    """What the replicas sent, by their own metrics (one worker each: ``--workers 1``)."""
    return sum(int(float(v)) for u in urls for _layer, v in _SENT.findall(httpx.get(f"{u}/metrics", timeout=10).text))


def real_nodes(root: Path, urls: Sequence[str], nodes: int, procs: int, weed: WeedWithMetrics | None = None) -> dict[str, Any]:
    """``nodes`` real nodes of ``procs`` interpreters each, all started at once, vs one node of
    one interpreter: bytes the service (and S3, for presigned downloads) sent per node, and each
    node's prefetch time (its claim holder's)."""

    def s3_sent() -> int:
        return weed.counters()[1] if weed is not None else 0

    def start(run: Path, n_nodes: int, n_procs: int) -> tuple[int, list[float], list[dict[str, Any]]]:
        before = _bytes_sent(urls) + s3_sent()
        procs_: list[tuple[int, subprocess.Popen[str]]] = []
        for i in range(n_nodes):
            env = Node(run / f"node{i}").env(KCACHE_URL=urls[i % len(urls)], KCACHE_NAMESPACE=NS,
                                            KCACHE_WORKLOAD=WORKLOAD, KCACHE_MODE="readonly")
            procs_ += [(i, subprocess.Popen([sys.executable, "-c", REAL_JOB], env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)) for _ in range(n_procs)]
        reports = []
        for _i, p in procs_:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"real node process failed ({p.returncode}): {err[-2000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        per_node: dict[int, float] = {}  # a node is warm when its last process's prefetch is done
        for (i, _p), rep in zip(procs_, reports, strict=True):
            per_node[i] = max(per_node.get(i, 0.0), rep["seconds"])
        return _bytes_sent(urls) + s3_sent() - before, sorted(per_node.values()), reports

    one_bytes, one_times, _ = start(root / "one", 1, 1)
    many_bytes, many_times, reports = start(root / "many", nodes, procs)
    return {
        "nodes": nodes, "procs_per_node": procs,
        # Bytes the replicas sent (their metrics) plus, with presigned downloads, what S3 sent.
        "one_node_one_proc_mb": round(one_bytes / MB, 3), "one_node_prefetch_s": one_times[0] if one_times else None,
        "mb_per_node": round(many_bytes / nodes / MB, 3),
        "bytes_per_node_vs_one_node": round(many_bytes / nodes / max(one_bytes, 1), 3),
        # Processes that found another one of their node prefetching (the rest started first,
        # or after it was done: they found everything in the tier).
        "followers": sum(1 for rep in reports if rep["following"]),
        "prefetch_s": [round(t, 3) for t in many_times],
    }


# ---- setups -----------------------------------------------------------------------------------


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("KCACHE_"):
        raise argparse.ArgumentTypeError(f"{text!r}: KCACHE_NAME=VALUE expected")
    return name, value


@contextlib.contextmanager
def replicas(root: Path, env: dict[str, str], count: int, workers: int, name: str) -> Iterator[list[ServerProcess]]:
    servers = [ServerProcess(root / f"{name}{i}" / "data", root / f"{name}{i}", args=["--workers", str(workers)],
                             env=server_env(root / f"{name}{i}", **env), name=f"{name}{i}", ready_path="/readyz")
               for i in range(count)]
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_ready(120)
        yield servers
    finally:
        for s in servers:
            s.stop()


def direct_urls(url: str, workload: Workload) -> dict[tuple[str, str], str]:
    """Presigned S3 URLs of every pack and entry, asked once of a presigned replica."""
    with httpx.Client(base_url=url, timeout=60) as c:
        body = c.post(f"/v1/{NS}/kernels:batch-urls", json={"keys": list(workload.packs)}).json()
        out = {("kernel", k): u for k, u in body["urls"].items()}
        for layer, key in workload.entries:
            r = c.get(f"/v1/{NS}/entries/{layer}/{key}")
            assert r.status_code == 307, r.status_code
            out[(layer, key)] = r.headers["location"]
    assert len(out) == len(workload.packs) + len(workload.entries)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_burst", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=200, help="simulated nodes per burst")
    parser.add_argument("--procs", type=int, default=8, help="processes (ranks) per node")
    parser.add_argument("--replicas", type=int, default=2, help="service replicas over S3 + Redis")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per replica")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpt2-train")
    parser.add_argument("--setups", default="embedded,s3,s3-presigned,s3-direct")
    # 9: a median of 3 single nodes ranged 0.24-0.45 s between runs on one idle machine, and every
    # ratio divides by it.
    parser.add_argument("--baseline-repeats", type=int, default=9)
    parser.add_argument("--ramp-load", type=float, default=0.5,
                        help="then nodes arriving at this fraction of the burst's node rate, as many as take the burst's time (0: no ramp)")
    parser.add_argument("--drivers", type=int, default=2, help="processes that run the simulated nodes (each its own event loop)")
    parser.add_argument("--client-deadlines", action="store_true",
                        help="the simulated clients give up where kcache's client does (default: they wait; each request is held to those deadlines afterwards)")
    parser.add_argument("--real-nodes", type=int, default=3, help="real nodes of --procs interpreters (0: none)")
    parser.add_argument("--service-env", type=_setting, action="append", default=[], metavar="KCACHE_X=VALUE",
                        help="a setting of every replica (repeatable), e.g. KCACHE_PRESIGN_REUSE_S=0 for the A/B of URL reuse")
    parser.add_argument("--entry-gets", action="store_true",
                        help="presigned nodes take entries by one redirected GET each (clients before entries:batch-urls)")
    parser.add_argument("--result-name", default="fleet_burst")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # hundreds of nodes hold thousands of sockets (here and in the replicas we start)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = set(setups) - {"embedded", "s3", "s3-presigned", "s3-direct"}
    if unknown:
        parser.error(f"unknown setups: {sorted(unknown)}")

    profile = PROFILES[args.profile]
    root = common.tmp_root("fleet-")
    res: dict[str, Any] = {}
    t_start = time.perf_counter()
    try:
        workload = make_workload(profile)
        want = workload.digests()
        fingerprint = node_fingerprint(root)
        print(f"workload {args.profile}: {len(workload.packs)} packs, {len(workload.entries)} entries, "
              f"{workload.nbytes / MB:.2f} MB per node", flush=True)
        res["workload"] = {"profile": args.profile, "shape_of": profile.source, "packs": len(workload.packs),
                           "pack_mb": round(sum(map(len, workload.packs.values())) / MB, 3),
                           "entries": len(workload.entries),
                           "entry_mb": round(sum(map(len, workload.entries.values())) / MB, 3),
                           "mb_per_node": round(workload.nbytes / MB, 3)}
        base_env = {"KCACHE_LOG_LEVEL": "warning", "KCACHE_ACCESS_FLUSH_S": "2"} | dict(args.service_env)
        if "embedded" in setups:
            with replicas(root / "embedded", base_env, 1, args.workers, "embedded") as servers:
                fp = publish(servers[0].url, workload, fingerprint)
                tier = Tier(servers, None, None)
                res["embedded"] = run_setup("embedded", tier, [servers[0].url], fp, want, args, workload.nbytes)
                if args.real_nodes and args.workers == 1:
                    res["embedded"]["real_nodes"] = real_nodes(root / "real-embedded", [servers[0].url], args.real_nodes, args.procs)
                    print(f"[embedded] real nodes: {res['embedded']['real_nodes']}", flush=True)
        s3_setups = [s for s in setups if s.startswith("s3")]
        if s3_setups:
            weed = WeedWithMetrics(root / "weed")
            redis = RedisServer(root / "redis")
            try:
                weed.start()
                weed.create_bucket(BUCKET)
                weed.wait_serving(BUCKET)
                redis.start()
                env = base_env | weed.env() | {"KCACHE_BLOB_URL": f"s3://{BUCKET}/packs", "KCACHE_INDEX_URL": redis.url,
                                               "KCACHE_PRESIGN_EXPIRES_S": "3600"}
                fp = ""
                if "s3" in s3_setups:
                    with replicas(root / "s3", env, args.replicas, args.workers, "s3-") as servers:
                        fp = publish(servers[0].url, workload, fingerprint)
                        res["s3"] = run_setup("s3", Tier(servers, redis, weed), [s.url for s in servers], fp, want,
                                              args, workload.nbytes)
                if "s3-presigned" in s3_setups or "s3-direct" in s3_setups:
                    penv = env | {"KCACHE_PRESIGNED_DOWNLOADS": "true"}
                    with replicas(root / "s3p", penv, args.replicas, args.workers, "s3p-") as servers:
                        fp = fp or publish(servers[0].url, workload, fingerprint)
                        urls = [s.url for s in servers]
                        if "s3-presigned" in s3_setups:
                            res["s3-presigned"] = run_setup("s3-presigned", Tier(servers, redis, weed), urls, fp, want,
                                                            args, workload.nbytes)
                            if args.real_nodes and args.workers == 1:
                                rn = real_nodes(root / "real-s3p", urls, args.real_nodes, args.procs, weed)
                                res["s3-presigned"]["real_nodes"] = rn
                                print(f"[s3-presigned] real nodes: {rn}", flush=True)
                        if "s3-direct" in s3_setups:
                            direct = direct_urls(urls[0], workload)
                            res["s3-direct"] = run_setup("s3-direct", Tier([], redis, weed), [], fp, want, args,
                                                         workload.nbytes, direct)
            finally:
                redis.stop()
                weed.stop()
    finally:
        common.drop_dir(root)
    res["total_s"] = round(time.perf_counter() - t_start, 1)
    _verdicts(res, setups)
    common.write_result(args.result_name, {"benchmark": "fleet_burst", "machine": common.machine(),
                                           "params": {k: str(v) for k, v in vars(args).items()},
                                           "command": "python -m bench.fleet_burst " + " ".join(argv if argv is not None else sys.argv[1:]),
                                           "results": res})
    return 0


def _verdicts(res: dict[str, Any], setups: Sequence[str]) -> None:
    print("\nsetup          phase  nodes  nodes/s  MB/s   p50 s  p99 s  p99/unl  5xx  lost  API CPU ms/node  API MB/node  "
          "Redis cmd/node  S3 req/node  peak RSS MiB")
    for s in setups:
        for phase in ("burst", "ramp"):
            r = res.get(s, {}).get(phase)
            if r is None:
                continue
            print(f"{s:<14} {phase:<6} {r['nodes']:>5}  {r['nodes_per_s']:>7}  {r['delivered_mb_per_s']:>5}  "
                  f"{r['warm_s']['p50']:>6}  {r['warm_s']['p99']:>5}  {r['vs_unloaded']['p99']:>7}  {r['http_5xx']:>3}  "
                  f"{r['items_lost'] + r['items_corrupt']:>4}  {r['api_cpu_ms_per_node']:>15}  {r['api_mb_per_node']:>11}  "
                  f"{r.get('redis_commands_per_node', '-'):>14}  {r.get('s3_requests_per_node', '-'):>11}  "
                  f"{r['api_tier_memory']['peak_rss_mib_max']:>12}")
    for s in setups:
        r = res.get(s, {}).get("burst")
        if r is not None:
            ok = r["http_5xx"] == 0 and r["items_lost"] == 0 and r["items_corrupt"] == 0
            print(f"{s}: 0 x 5xx and no lost or partial download in the burst: {common.verdict(ok)}")
    for s in ("s3-presigned",):
        for phase in ("burst", "ramp"):
            r = res.get(s, {}).get(phase)
            if r is None:
                continue
            print(f"{s} {phase}: p99 <= 2x unloaded: {common.verdict(r['vs_unloaded']['p99'] <= 2)} ({r['vs_unloaded']['p99']}x)")
            limit = res.get("s3-direct", {}).get(phase)
            if limit is not None:  # the object store alone, same nodes, same run
                print(f"{s} {phase}: p99 vs the object store alone (s3-direct): {r['warm_s']['p99'] / limit['warm_s']['p99']:.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
