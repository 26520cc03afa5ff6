"""The client installs alone: ``pip install ./client`` into a fresh venv (no system site packages)
gives ``kcache`` and ``kcache_schemas`` without FastAPI, uvicorn, boto3, redis or torch, and its CLI
pushes to and pulls from a real service (started from the development venv).

Building the venv takes ~20 s (pip fetches pydantic/httpx/zstandard and hatchling). It is cached in
pytest's cache dir, keyed by a hash of client/pyproject.toml and every packaged source file, so a
re-run with unchanged client sources costs nothing; any change rebuilds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcache_testkit.pace import HANG_S
from kcache_testkit.service import ServerProcess, clean_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
NOT_INSTALLED = ("fastapi", "uvicorn", "starlette", "pydantic_settings", "boto3", "redis", "torch", "triton")


def client_fingerprint() -> str:
    h = hashlib.sha256(f"{sys.version_info[:3]}".encode())
    files = [REPO / "client" / "pyproject.toml", REPO / "client" / "kcache_autoload.pth"]
    files += sorted((REPO / "client" / "kcache").rglob("*.py")) + sorted((REPO / "schemas" / "kcache_schemas").rglob("*.py"))
    for f in files:
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def venv_env(**extra: str) -> dict[str, str]:
    env = clean_env(**extra)
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "TRITON_CACHE_MANAGER"):
        env.pop(name, None)
    return env


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as fh:  # xdist workers: one builds, the others wait and reuse
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def client_venv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)
    root = cache.mkdir("kcache-client-venv") if cache is not None else tmp_path_factory.mktemp("client-venv")
    key = client_fingerprint()
    venv = root / key
    with locked(root / ".lock"):
        if not (venv / ".complete").is_file():
            for stale in root.iterdir():
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=venv_env(), timeout=HANG_S)
            proc = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "./client"],
                cwd=REPO, env=venv_env(), capture_output=True, text=True, timeout=HANG_S,
            )
            if proc.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                pytest.fail(f"pip install ./client failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            (venv / ".complete").write_text(f"built in {time.perf_counter() - t0:.1f}s\n")
    return venv


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("client-install-service")
    with ServerProcess(root / "data", root, env=clean_env(KCACHE_AUTOLOAD="0")) as svc:
        yield svc


@pytest.fixture(scope="module")
def kernel_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from kcache_testkit.corpus import compile_small

    return compile_small(tmp_path_factory.mktemp("client-install-triton"), count=3, arch=90)


def run(venv: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    exe = args[0] if args[0].startswith("/") else str(venv / "bin" / args[0])
    return subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=HANG_S, cwd=cwd, env=venv_env(**env))


def test_installs_alone_without_service_or_torch_dependencies(client_venv: Path, tmp_path: Path) -> None:
    script = (
        "import importlib.util, json, sys\n"
        "import kcache, kcache_schemas, kcache.transport.http, kcache.runtime, kcache.cli, kcache.store.emitter\n"
        f"absent = {NOT_INSTALLED!r}\n"
        "print(json.dumps({'present': [m for m in absent if importlib.util.find_spec(m) is not None],"
        " 'file': kcache.__file__, 'prefix': sys.prefix, 'base': sys.base_prefix}))\n"
    )
    proc = run(client_venv, "python", "-c", script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["present"] == [], f"the client venv can import {info['present']}"
    assert info["file"].startswith(str(client_venv)), info  # the installed copy, not the repo's
    assert Path(info["prefix"]) == client_venv


def test_cli_help_and_serve_refusal(client_venv: Path, tmp_path: Path) -> None:
    proc = run(client_venv, "kcache", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for command in ("push", "pull", "ls", "inspect", "serve"):
        assert command in proc.stdout

    proc = run(client_venv, "kcache", "serve", "--port", "1", cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "kcache serve needs the service" in proc.stderr and "install kcache-server from a kcache checkout" in proc.stderr
    assert "pip install kcache\n" not in proc.stderr + "\n" and "pip install kcache " not in proc.stderr, proc.stderr


def test_autoload_and_install_without_torch(client_venv: Path, tmp_path: Path, service: ServerProcess) -> None:
    script = (
        "import sys, kcache\n"
        "start = sorted(m for m in sys.modules if m.split('.')[0] in ('kcache', 'httpx', 'pydantic'))\n"
        "ok = kcache.install()\n"
        "from kcache.current import get_runtime\n"
        "rt = get_runtime()\n"
        "print(start, ok, rt.missing_kernels(['A' * 52]))\n"
        "kcache.uninstall()\n"
    )
    proc = run(client_venv, "python", "-c", script, cwd=tmp_path, KCACHE_URL=service.url,
               KCACHE_LOCAL_DIR=str(tmp_path / "local"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['kcache', 'kcache._autoload'] True ['AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA']", proc.stdout


def test_push_and_pull_against_a_real_service(
    client_venv: Path, tmp_path: Path, service: ServerProcess, kernel_dirs: list[Path]
) -> None:
    src = kernel_dirs[0].parent
    proc = run(client_venv, "kcache", "push", str(src), "--url", service.url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"pushed {len(kernel_dirs)} kernels" in proc.stdout, proc.stdout

    proc = run(client_venv, "kcache", "push", str(src), "--url", service.url, cwd=tmp_path)
    assert proc.returncode == 0 and f"{len(kernel_dirs)} already present" in proc.stdout, proc.stdout

    proc = run(client_venv, "kcache", "ls", "--json", "--url", service.url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(e["key"] for e in json.loads(proc.stdout)) == sorted(d.name for d in kernel_dirs)

    dest = tmp_path / "pulled"
    proc = run(client_venv, "kcache", "pull", "--all", "--dest", str(dest), "--url", service.url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"pulled {len(kernel_dirs)} of {len(kernel_dirs)}" in proc.stdout, proc.stdout
    for d in kernel_dirs:
        got = dest / d.name
        assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in d.iterdir())
        group = json.loads(next(got.glob("__grp__*.json")).read_text())
        assert {Path(p).parent for p in group["child_paths"].values()} == {got}
        for f in d.iterdir():
            if f.suffix != ".json":  # binaries and IR byte-identical; JSON carries the new path
                assert (got / f.name).read_bytes() == f.read_bytes(), f.name
    assert not [p for p in dest.iterdir() if p.name.startswith("tmp.")]


def test_ed25519_keys_without_cryptography_refuse_every_entry_upload_none_and_warn_once(
    client_venv: Path, tmp_path: Path, service: ServerProcess
) -> None:
    """``kcache-client`` without its ``[signing]`` extra, configured for Ed25519: safe (nothing
    unsigned or unchecked gets through, nothing unsigned goes up), one warning, the job goes on."""
    import httpx
    from kcache.config import ClientConfig
    from kcache.transport.entry_signing import EntrySigning, generate_key_pair
    from kcache.transport.http import KcacheClient

    pem, public_line, _ = generate_key_pair("producer")  # made where cryptography is installed
    (tmp_path / "k.key").write_bytes(pem)
    (tmp_path / "k.pub").write_text(public_line)
    signing = EntrySigning.from_config(ClientConfig(signing_private_key=str(tmp_path / "k.key")))
    assert signing is not None
    key = "pt2:fx-graph-v1::no-cryptography:c1"
    KcacheClient(ClientConfig(url=service.url)).put_entry("fx-graph", key, signing.seal("fx-graph", key, b"graph"))
    script = (
        "import importlib.util, json\n"
        "from kcache.config import ClientConfig\nfrom kcache.runtime import Runtime\n"
        "rt = Runtime(ClientConfig.from_env())\n"
        f"got = [rt.get_entry('fx-graph', {key!r}) for _ in range(2)]\n"
        "rt.put_entry('fx-graph', 'pt2:fx-graph-v1::would-be-unsigned:c1', b'graph', now=True)\n"
        "rt.close()\n"
        "print(json.dumps({'cryptography': importlib.util.find_spec('cryptography') is not None,"
        " 'got': got == [None, None], 'fx': rt.stats.snapshot()['fx-graph'].model_dump()}))\n"
    )
    proc = run(client_venv, "python", "-c", script, cwd=tmp_path, KCACHE_URL=service.url, KCACHE_LOCAL_DIR=str(tmp_path / "local"),
               KCACHE_SIGNING_PRIVATE_KEY=str(tmp_path / "k.key"), KCACHE_TRUSTED_KEYS=str(tmp_path / "k.pub"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["cryptography"] is False and report["got"] is True
    assert report["fx"]["errors"] == 2 and report["fx"]["puts"] == 0
    assert report["fx"]["error_kinds"] == {"unavailable": 2, "signing_unavailable": 1}
    assert proc.stderr.count("kcache:") == 1 and "pip install cryptography" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert httpx.head(f"{service.url}/v1/default/entries/fx-graph/pt2:fx-graph-v1::would-be-unsigned:c1", timeout=HANG_S).status_code == 404

    keygen = run(client_venv, "kcache", "keygen", "--out", str(tmp_path / "new"), cwd=tmp_path)
    assert keygen.returncode == 2 and "pip install cryptography" in keygen.stderr and not (tmp_path / "new.key").exists()
