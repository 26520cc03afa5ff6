"""Shared helpers for the kcache benchmarks: corpus, servers, timing, result files.

Benchmarks are not tests: each one prints its figures and the ratios against its baselines
measured in the same run, and writes ``bench/results/<name>.json`` with a description of the
machine. Servers (``kcache serve``, SeaweedFS, Redis, nginx) run as subprocesses on free
loopback ports; SeaweedFS and Redis are started with the helpers of ``tests/servers.py``.
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
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
# Scratch space on the same filesystem as the corpus (git-ignored), so copies are comparable.
WORK_DIR = BENCH_DIR / ".work"
HOST = "127.0.0.1"
DEFAULT_N = 500


# ---- corpus ---------------------------------------------------------------------------------


def corpus_dirs(n: int) -> list[Path]:
    """The kernel dirs of the first ``n`` corpus specs (compiled on first use, then cached)."""
    from bench import corpus

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


def _servers() -> Any:
    """tests/servers.py (SeaweedFS, Redis start helpers); importable from the repo root."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import tests.servers as servers

    return servers


def free_port() -> int:
    return int(_servers().free_ports(1)[0])


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    import httpx

    _servers().wait_until(url, lambda: httpx.get(url, timeout=5).status_code == 200, timeout, proc, log)


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Stop a server we started (its own session: uvicorn's workers go with it)."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # start_new_session=True: the group is ours alone
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def kcache_service(root: Path, env: dict[str, str] | None = None, workers: int = 1) -> Iterator[str]:
    """``kcache serve --workers N`` (the production command) as a subprocess; yields its URL."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = root / f"kcache-{port}.log"
    penv = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "AWS_", "TRITON_"))}
    penv.update({
        "KCACHE_DATA_DIR": str(root / "data"),
        "KCACHE_LOG_LEVEL": "warning",
        "KCACHE_AUTOLOAD": "0",
        "AWS_CONFIG_FILE": str(root / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-credentials"),
        "PYTHONUNBUFFERED": "1",
    })
    penv.update(env or {})
    kcache_bin = shutil.which("kcache", path=str(Path(sys.executable).parent)) or "kcache"
    cmd = [kcache_bin, "serve", "--host", HOST, "--port", str(port), "--workers", str(workers)]
    with log.open("ab") as fh:
        proc = subprocess.Popen(cmd, env=penv, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://{HOST}:{port}"
    try:
        wait_http(f"{url}/readyz", proc, log)
        yield url
    finally:
        stop(proc)


@contextlib.contextmanager
def redis_server(root: Path) -> Iterator[Any]:
    """A ``redis-server`` of our own on a free port (tests/servers.py RedisServer)."""
    server = _servers().RedisServer(root).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def seaweedfs(root: Path, bucket: str) -> Iterator[Any]:
    """``weed mini`` on loopback (tests/servers.py SeaweedFS), with ``bucket`` created."""
    server = _servers().SeaweedFS(root)
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
    from kcache.http import KcacheClient

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
