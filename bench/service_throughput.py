"""Service throughput: concurrent pack GETs against nginx, PUTs with verification, find-missing.

* GET: ``wrk`` (Debian's, C, epoll) with a Lua script that cycles over the N pack URLs, at 1, 8
  and 32 connections (keep-alive), against

  - kcache: ``kcache serve --workers 2`` (the production command; 2 workers on this 2-core box),
    embedded backend (file blobs + SQLite index), and
  - nginx: the baseline, 2 worker processes, serving the same pack bytes as static files from
    disk under the same URL paths (sendfile, no access log).

  Runs alternate between the two servers so both see the same background noise; the figures are
  medians over the repeats. wrk runs on the same two cores as the server: the load generator and
  the server compete, for nginx as for kcache.
* PUT: every pack uploaded once (8 client threads, ``KcacheClient.put_pack``, as ``kcache push``
  does) into an empty namespace with the blob dir emptied first, so every request does the full
  verify -> write blob (fsync) -> verify -> index insert.
* find-missing: ``POST /v1/default/kernels:missing`` with 10,000 keys (N stored, the rest not).

Targets: kcache GET throughput >= 0.5x nginx; p99 <= 10 ms at 32 clients.

    python -m bench.service_throughput [--n 500] [--duration 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import common

CONNECTIONS = (1, 8, 32)
NS = "default"

_LUA = r"""
local paths = {}
for line in io.lines(os.getenv("KCACHE_BENCH_PATHS")) do paths[#paths + 1] = line end
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("offset", counter * 7919)
end
local i = 0
function init(args)
  i = (tonumber(wrk.thread:get("offset")) or 0) % #paths
end
function request()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "bytes": %d, "duration_us": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"max_us": %d}\n',
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max))
end
"""

_NGINX_CONF = """
worker_processes 2;
{user}daemon off;
master_process on;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_requests 100000000;
  keepalive_timeout 65;
  types {{ }}
  default_type application/vnd.kcache.pack.v1;
  client_body_temp_path {root}/tmp/body;
  proxy_temp_path {root}/tmp/proxy;
  fastcgi_temp_path {root}/tmp/fastcgi;
  uwsgi_temp_path {root}/tmp/uwsgi;
  scgi_temp_path {root}/tmp/scgi;
  server {{
    listen {host}:{port};
    root {root}/www;
    location / {{ }}
  }}
}}
"""


@contextlib.contextmanager
def nginx(root: Path, packs: dict[str, bytes]) -> Iterator[str]:
    """nginx (not daemonized, our own config) serving the packs at the kcache URL paths."""
    www = root / "www" / "v1" / NS / "kernels"
    www.mkdir(parents=True)
    (root / "tmp").mkdir()
    for key, data in packs.items():
        (www / key).write_bytes(data)
    port = common.free_port()
    conf = root / "nginx.conf"
    # As root, nginx would hand the workers to "nobody", who may not read our scratch dir.
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf.write_text(_NGINX_CONF.format(root=root, host=common.HOST, port=port, user=user))
    log = root / "nginx.stderr"
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
    with log.open("ab") as fh:
        proc = subprocess.Popen([nginx_bin, "-c", str(conf), "-p", str(root), "-e", str(root / "error.log")],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://{common.HOST}:{port}"
    try:
        common.wait_http(f"{url}/v1/{NS}/kernels/{next(iter(packs))}", proc, log, timeout=20)
        yield url
    finally:
        common.stop(proc, sig=15)


def wrk(url: str, paths_file: Path, script: Path, connections: int, duration: int) -> dict[str, Any]:
    threads = min(2, connections)
    env = dict(os.environ, KCACHE_BENCH_PATHS=str(paths_file))
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, duration)}s", "--timeout", "10s",
           "-s", str(script), url]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration + 60)
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRKJSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
    r = json.loads(line[len("WRKJSON "):])
    secs = r["duration_us"] / 1e6
    errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    return {
        "rps": r["requests"] / secs,
        "mb_s": r["bytes"] / secs / 1e6,
        "p50_ms": r["p50_us"] / 1e3,
        "p90_ms": r["p90_us"] / 1e3,
        "p99_ms": r["p99_us"] / 1e3,
        "max_ms": r["max_us"] / 1e3,
        "requests": r["requests"],
        "errors": errors,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("rps", "mb_s", "p50_ms", "p90_ms", "p99_ms", "max_ms")
    out: dict[str, Any] = {k: common.median([r[k] for r in runs]) for k in keys}
    out["errors"] = sum(r["errors"] for r in runs)
    out["runs"] = runs
    return out


def random_keys(n: int, seed: str) -> list[str]:
    return [
        base64.b32encode(hashlib.sha256(f"{seed}-{i}".encode()).digest()).decode().rstrip("=")
        for i in range(n)
    ]


def bench_put(client_url: str, data_dir: Path, packs: dict[str, bytes], repeats: int) -> dict[str, Any]:
    """Cold PUTs: each repeat into a new namespace with the blob dir emptied first."""
    runs = []
    total = sum(map(len, packs.values()))
    for r in range(repeats):
        blobs = data_dir / "blobs"
        if blobs.exists():
            for child in blobs.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
        client = common.new_client(client_url, namespace=f"put{r}-{os.getpid()}")
        try:
            secs = common.populate(client, packs)
        finally:
            client.close()
        runs.append({"seconds": secs, "packs_s": len(packs) / secs, "mb_s": total / secs / 1e6})
    return {
        "packs_s": common.median([x["packs_s"] for x in runs]),
        "mb_s": common.median([x["mb_s"] for x in runs]),
        "threads": 8,
        "runs": runs,
    }


def bench_missing(url: str, present: list[str], repeats: int) -> dict[str, Any]:
    import httpx

    keys = present + random_keys(10_000 - len(present), "absent")
    body = json.dumps({"keys": keys})
    single, client_ms = [], []
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = http.post(f"/v1/{NS}/kernels:missing", content=body, headers={"Content-Type": "application/json"})
            single.append((time.perf_counter() - t0) * 1e3)
            r.raise_for_status()
            if len(r.json()["missing"]) != 10_000 - len(present):
                raise RuntimeError("kernels:missing answered the wrong set")
    client = common.new_client(url)
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            missing = client.missing(keys)
            client_ms.append((time.perf_counter() - t0) * 1e3)
            if len(missing) != 10_000 - len(present):
                raise RuntimeError("KcacheClient.missing answered the wrong set")
    finally:
        client.close()
    return {"keys": len(keys), "present": len(present),
            "one_request_ms": common.median(single), "one_request_runs_ms": single,
            "client_missing_ms": common.median(client_ms), "client_missing_runs_ms": client_ms}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.service_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=common.DEFAULT_N, help="kernels (100..2000)")
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="kcache serve --workers (default 2)")
    parser.add_argument("--result-name", default="service_throughput", help="bench/results/<name>.json")
    args = parser.parse_args(argv)
    if not shutil.which("wrk") or not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        raise SystemExit("needs wrk and nginx: apt-get install -y wrk nginx")

    info = common.machine()
    # uvicorn's "auto" picks httptools/uvloop when importable (the server inherits our env).
    stack = {m: importlib.util.find_spec(m) is not None for m in ("httptools", "uvloop")}
    dirs = common.corpus_dirs(args.n)
    packs = common.build_packs(dirs)
    total = sum(map(len, packs.values()))
    print(f"corpus: {len(packs)} packs, {total / 1e6:.1f} MB, mean {total / len(packs) / 1e3:.1f} KB")
    print(f"machine: {info['cpu_count']} x {info['cpu_model']}, load {info['loadavg_at_start']}")
    print(f"kcache serve --workers {args.workers} (embedded: file blobs + SQLite); nginx 2 workers; "
          f"load generator wrk (C, Lua URL cycling) on the same cores")
    print(f"uvicorn: http={'httptools' if stack['httptools'] else 'h11'}, loop={'uvloop' if stack['uvloop'] else 'asyncio'}")

    root = common.tmp_root("svc-")
    script = root / "cycle.lua"
    script.write_text(_LUA)
    paths_file = root / "paths.txt"
    paths_file.write_text("".join(f"/v1/{NS}/kernels/{k}\n" for k in packs))
    res: dict[str, Any] = {}
    try:
        with common.kcache_service(root / "kcache", workers=args.workers) as kurl, \
                nginx(Path(tempfile.mkdtemp(prefix="nginx-", dir=root)), packs) as nurl:
            res["put"] = bench_put(kurl, root / "kcache" / "data", packs, args.repeats)
            print(f"PUT (verify + store, 8 threads): {res['put']['packs_s']:.0f} packs/s, "
                  f"{res['put']['mb_s']:.1f} MB/s")
            # The GET namespace: every pack stored once more under "default".
            common.populate(common.new_client(kurl), packs)
            res["missing"] = bench_missing(kurl, list(packs), max(5, args.repeats))
            print(f"find-missing of 10,000 keys: {res['missing']['one_request_ms']:.1f} ms in one request, "
                  f"{res['missing']['client_missing_ms']:.1f} ms via KcacheClient.missing")
            for url in (kurl, nurl):  # warm-up: connections, page cache, lazy imports
                wrk(url, paths_file, script, 8, 1)
            raw: dict[str, dict[int, list[dict[str, Any]]]] = {"kcache": {}, "nginx": {}}
            for _ in range(args.repeats):
                for c in CONNECTIONS:
                    for name, url in (("kcache", kurl), ("nginx", nurl)):
                        raw[name].setdefault(c, []).append(wrk(url, paths_file, script, c, args.duration))
            res["get"] = {name: {str(c): summarize(runs) for c, runs in by_c.items()} for name, by_c in raw.items()}
            # The Python stack's own ceiling on this box: the cheapest route (no storage, ~15 B body).
            health = root / "health.txt"
            health.write_text("/healthz\n")
            res["healthz_c32"] = summarize([wrk(kurl, health, script, 32, args.duration) for _ in range(args.repeats)])
    finally:
        common.drop_dir(root)

    print(f"\nGET {'server':7} {'conns':>5} {'req/s':>9} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for name in ("kcache", "nginx"):
        for c in CONNECTIONS:
            g = res["get"][name][str(c)]
            print(f"    {name:7} {c:>5} {g['rps']:>9.0f} {g['mb_s']:>8.1f} {g['p50_ms']:>8.2f} {g['p99_ms']:>8.2f} {g['errors']:>6}")
    h = res["healthz_c32"]
    print(f"    kcache GET /healthz (no storage, framework ceiling) at 32: {h['rps']:.0f} req/s, "
          f"p50 {h['p50_ms']:.2f} ms, p99 {h['p99_ms']:.2f} ms")
    ratios = {f"get_rps_kcache_over_nginx_c{c}": res["get"]["kcache"][str(c)]["rps"] / res["get"]["nginx"][str(c)]["rps"]
              for c in CONNECTIONS}
    ratios["healthz_rps_over_nginx_c32"] = h["rps"] / res["get"]["nginx"]["32"]["rps"]
    k32 = res["get"]["kcache"]["32"]
    targets = {
        "get_ge_0.5x_nginx_c32": ratios["get_rps_kcache_over_nginx_c32"] >= 0.5,
        "get_p99_le_10ms_c32": k32["p99_ms"] <= 10.0,
    }
    print()
    for c in CONNECTIONS:
        print(f"ratio kcache/nginx req/s at {c:>2} connections = {ratios[f'get_rps_kcache_over_nginx_c{c}']:.2f}x")
    print(f"target kcache >= 0.5x nginx at 32 connections: {common.verdict(targets['get_ge_0.5x_nginx_c32'])}")
    print(f"target kcache p99 <= 10 ms at 32 connections ({k32['p99_ms']:.1f} ms): "
          f"{common.verdict(targets['get_p99_le_10ms_c32'])}")

    common.write_result(args.result_name, {
        "benchmark": "service_throughput",
        "machine": info,
        "params": {"n": len(packs), "pack_bytes": total, "duration_s": args.duration, "repeats": args.repeats,
                   "kcache": f"kcache serve --workers {args.workers}, file blobs + SQLite index",
                   "uvicorn_http": "httptools" if stack["httptools"] else "h11",
                   "uvicorn_loop": "uvloop" if stack["uvloop"] else "asyncio",
                   "nginx": "nginx 1.x, 2 worker processes, static files, sendfile, no access log",
                   "load_generator": "wrk -t min(2,c) -c c, Lua script cycling over the pack URLs, keep-alive",
                   "statistic": "median of repeats (runs alternate kcache/nginx)"},
        "results": res,
        "ratios": ratios,
        "targets": targets,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
