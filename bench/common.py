"""Shared helpers for the kcache benchmarks: corpus, servers, timing, result files.

Benchmarks are not tests: each one prints its figures and the ratios against its baselines
measured in the same run, and writes ``bench/results/<name>.json`` with a description of the
machine. Servers (``kcache serve``, SeaweedFS, Redis, nginx) run as subprocesses on free
loopback ports, started with :mod:`kcache_testkit` (the launchers the tests use too).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kcache_testkit.ports import HOST, free_port, kill, wait_until
from kcache_testkit.service import ServerProcess, server_env
from kcache_testkit.storage_servers import RedisServer, SeaweedFS

__all__ = ["HOST", "free_port"]  # the benchmarks reach the shared port helpers through this module

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
# Scratch space on the same filesystem as the corpus (git-ignored), so copies are comparable.
WORK_DIR = BENCH_DIR / ".work"
DEFAULT_N = 500


# ---- corpus ---------------------------------------------------------------------------------


def corpus_dirs(n: int) -> list[Path]:
    """The kernel dirs of the first ``n`` corpus specs (compiled on first use, then cached)."""
    from kcache_testkit import corpus

    root = corpus.cached_corpus(n)
    manifest = json.loads((corpus.CORPUS_ROOT / f"{corpus._tag()}.manifest.json").read_text())
    entries = manifest["kernels"]
    dirs = [root / entries[s.name] for s in corpus.corpus_specs(n)]
    missing = [d for d in dirs if not d.is_dir()]
    if missing:
        raise RuntimeError(f"corpus is missing {len(missing)} kernel dirs, e.g. {missing[0]}")
    return dirs


def kernel_name(kdir: Path) -> str:
    """Triton's kernel name: ``__grp__<name>.json`` names it."""
    for p in kdir.iterdir():
        if p.name.startswith("__grp__") and p.name.endswith(".json"):
            return p.name[len("__grp__") : -len(".json")]
    raise RuntimeError(f"{kdir}: no group file")


def dir_bytes(dirs: Sequence[Path]) -> int:
    return sum(f.stat().st_size for d in dirs for f in d.iterdir() if f.is_file())


def build_packs(dirs: Sequence[Path], level: int = 3) -> dict[str, bytes]:
    """key -> pack bytes, exactly as ``kcache push`` builds them."""
    from kcache_schemas.pack import build_pack, manifest_for_files, read_kernel_dir

    out: dict[str, bytes] = {}
    for d in dirs:
        files = read_kernel_dir(d)
        out[d.name] = build_pack(manifest_for_files(d.name, files), files, level)
    return out


# ---- measuring ------------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def default_dest_root() -> Path:
    """Where emitted Triton cache dirs go: tmpfs when there is one (see bench/README.md: the
    shared VM's ext4 takes 5-8 s of mostly kernel time to ``cp -r`` 60 MB, which would measure
    the disk, not the software), else bench/.work. ``KCACHE_BENCH_DEST`` overrides."""
    if env := os.environ.get("KCACHE_BENCH_DEST"):
        return Path(env)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"kcache-bench-{os.getpid()}"
    return WORK_DIR


def fresh_dir(name: str, root: Path | None = None) -> Path:
    """An empty scratch dir under ``root`` (default bench/.work), removed first if it exists."""
    path = (root or WORK_DIR) / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def drop_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---- results --------------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    versions: dict[str, str] = {}
    for mod in ("torch", "triton", "zstandard", "fastapi", "uvicorn", "httpx"):
        try:
            versions[mod] = str(__import__(mod).__version__)
        except Exception:
            versions[mod] = "absent"
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    mem_gb = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1e6, 1)
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_gb": mem_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions,
        "loadavg_at_start": [round(x, 2) for x in load],
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    print(f"\nwrote {path.relative_to(REPO)}")
    return path


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


# ---- servers --------------------------------------------------------------------------------


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    import httpx

    wait_until(url, lambda: httpx.get(url, timeout=5).status_code == 200, timeout, proc, log)


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Stop a server we started in its own session (its workers go with it)."""
    kill(proc, sig, group=True)


@contextlib.contextmanager
def kcache_service(root: Path, env: dict[str, str] | None = None, workers: int = 1) -> Iterator[str]:
    """``kcache serve --workers N`` (the production command) as a subprocess; yields its URL."""
    env = {"KCACHE_DATA_DIR": str(root / "data"), **(env or {})}
    server = ServerProcess(root / "data", root, args=["--workers", str(workers)], env=server_env(root, **env),
                           name="kcache", ready_path="/readyz")
    with server:
        yield server.url


@contextlib.contextmanager
def redis_server(root: Path) -> Iterator[RedisServer]:
    """A ``redis-server`` of our own on a free port."""
    server = RedisServer(root).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def seaweedfs(root: Path, bucket: str) -> Iterator[SeaweedFS]:
    """``weed mini`` on loopback, with ``bucket`` created."""
    server = SeaweedFS(root)
    try:
        server.start()
        server.create_bucket(bucket)
        server.wait_serving(bucket)
        yield server
    finally:
        server.stop()


def new_client(url: str, namespace: str = "default", timeout_s: float = 60.0) -> Any:
    import dataclasses

    from kcache.config import ClientConfig
    from kcache.transport.http import KcacheClient

    config = ClientConfig(url=url, namespace=namespace)
    return KcacheClient(dataclasses.replace(config, read_timeout_s=timeout_s, connect_timeout_s=10.0))


def populate(client: Any, packs: dict[str, bytes], threads: int = 8) -> float:
    """PUT every pack (concurrently, as ``kcache push`` does); returns the seconds it took."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda kv: client.put_pack(kv[0], kv[1]), packs.items()))
    return time.perf_counter() - t0


def tmp_root(prefix: str) -> Path:
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=WORK_DIR))
