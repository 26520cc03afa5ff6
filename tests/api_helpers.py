"""Fixtures and helpers for the schema, pack, API, auth and serve tests.

Load with ``pytest_plugins = ["api_helpers"]`` in a test module.

* ``kernels``: a few real Triton kernel dirs for sm_90, compiled once per session on the CPU
  (``kcache_testkit.kernels``), each with its ``[REPLACE]``-form files, manifest and pack.
* ``client``: the same test body runs against the app in-process (``TestClient``) and against a
  real ``kcache serve`` (uvicorn) subprocess on loopback. Tests isolate themselves by namespace
  (``ns``), so one server serves the whole session.
* Forging hostile packs by hand (``raw_pack``, ``forge_pack``), bypassing ``build_pack``'s checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tarfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard
from fastapi.testclient import TestClient
from kcache_schemas.pack import MANIFEST_NAME
from kcache_server.app import create_app
from kcache_server.settings import Settings

from kcache_testkit.kernels import Kernel, real_kernels
from kcache_testkit.service import ServerProcess, clean_env

REPO = Path(__file__).resolve().parent.parent

# Strong tokens for auth tests (>= 16 chars, not a default secret).
READ_TOKEN = "read-token-0123456789abcdef"
WRITE_TOKEN = "write-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
TEAM_A_TOKEN = "team-a-token-0123456789abcdef"


# ---- real kernels ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kernel_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("triton-cache")


@pytest.fixture(scope="session")
def kernels(kernel_cache_dir: Path) -> list[Kernel]:
    """Five real, distinct sm_90 kernel dirs (add / gelu / mul_add), compiled once."""
    out = real_kernels(kernel_cache_dir, count=5)
    assert len({k.key for k in out}) == 5
    return out


@pytest.fixture
def kernel(kernels: list[Kernel]) -> Kernel:
    return kernels[0]


@pytest.fixture(scope="session")
def bundler_artifacts(kernels: list[Kernel], kernel_cache_dir: Path) -> dict[str, dict[str, bytes]]:
    """``TritonBundler.collect()`` output for the first two kernels: key -> {filename: payload}."""
    pytest.importorskip("torch")
    from torch._inductor import config
    from torch._inductor.triton_bundler import TritonBundler

    with pytest.MonkeyPatch.context() as mp, config.patch(bundle_triton_into_fx_graph_cache=True):
        # Inductor's triton_cache_dir(device) is $TRITON_CACHE_DIR when set.
        mp.setenv("TRITON_CACHE_DIR", str(kernel_cache_dir))
        TritonBundler.begin_compile()
        try:
            for k in kernels[:2]:
                TritonBundler.put(k.key, device=0)
            bundle, _meta = TritonBundler.collect()
        finally:
            TritonBundler.end_compile()
    out: dict[str, dict[str, bytes]] = {}
    for art in bundle.kernel_artifacts:
        out[art.kernel_hash] = {a.filename: a.payload for a in art.artifacts}
    return out


# ---- forging packs by hand --------------------------------------------------------------------


def file_entry(name: str, data: bytes) -> dict[str, Any]:
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def manifest_dict(kernel: Kernel, files: Mapping[str, bytes], **overrides: Any) -> dict[str, Any]:
    """The kernel's manifest as JSON data, its file list recomputed from ``files`` (unchecked)."""
    d = kernel.manifest.model_dump(mode="json")
    d["files"] = [file_entry(n, b) for n, b in files.items()]
    d.update(overrides)
    return d


def member(name: str, data: bytes | None = b"", **attrs: Any) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if data is not None else 0
    info.mode, info.mtime = 0o644, 0
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


def raw_pack(
    members: list[tuple[tarfile.TarInfo, bytes | None]], global_pax: dict[str, str] | None = None
) -> bytes:
    """zstd(tar) of exactly these members (data written as given), no checks at all."""
    raw = io.BytesIO()
    with tarfile.open(
        fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT, pax_headers=global_pax
    ) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor(level=3).compress(raw.getvalue())


def forge_pack(manifest: Mapping[str, Any], files: Mapping[str, bytes]) -> bytes:
    """A pack in the v1 layout whose manifest and files are whatever the caller says."""
    return raw_pack(
        [member(MANIFEST_NAME, json.dumps(manifest).encode())]
        + [member(n, b) for n, b in files.items()]
    )


# ---- assertions ----------------------------------------------------------------------------


def assert_error(resp: httpx.Response, status: int, code: str, *fragments: str) -> dict[str, Any]:
    """A JSON error body ``{"error": {"code", "message"}}`` whose message names the problem."""
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and len(err["message"]) >= 10, err
    for frag in fragments:
        assert frag.lower() in err["message"].lower(), (frag, err["message"])
    return err


def assert_nothing_stored(client: httpx.Client, ns: str, *keys: str) -> None:
    for key in keys:
        resp = client.get(f"/v1/{ns}/kernels/{key}")
        assert_error(resp, 404, "not_found")
        assert client.head(f"/v1/{ns}/kernels/{key}").status_code == 404
    listing = client.get(f"/v1/{ns}/kernels")
    assert listing.status_code == 200, listing.text
    assert listing.json() == {"items": [], "next_cursor": None}


# ---- in-process app --------------------------------------------------------------------------


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings independent of any KCACHE_* variables in the test environment."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "blob_url": None,
        "index_url": None,
        "tokens": None,
        "tokens_file": None,
        "host": "127.0.0.1",
        "presigned_downloads": False,
    }
    values.update(overrides)
    return Settings(**values)


@contextlib.contextmanager
def inproc_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


# ---- a real `kcache serve` subprocess ----------------------------------------------------------


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One open (loopback, tokenless) ``kcache serve`` for the session's API tests."""
    root = tmp_path_factory.mktemp("live-server")
    server = ServerProcess(root / "data", root).start()
    try:
        yield server
    finally:
        server.stop()


# ---- the parametrised client ------------------------------------------------------------------


@pytest.fixture(params=["inproc", pytest.param("uvicorn", marks=pytest.mark.slow)])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    """An HTTP client for an open kcache: the app in-process, or a real server on loopback."""
    if request.param == "inproc":
        with inproc_client(make_settings(tmp_path / "data")) as c:
            yield c
    else:
        server: ServerProcess = request.getfixturevalue("live_server")
        with server.client() as c:
            yield c


# Small limits for the size tests: real kernel packs (~10 KB, ~40 KB unpacked) fit comfortably.
LIMITS: dict[str, int] = {"max_pack_bytes": 64 << 10, "max_unpacked_bytes": 1 << 20}


@pytest.fixture(scope="session")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limited-server")
    env = clean_env(**{f"KCACHE_{k.upper()}": str(v) for k, v in LIMITS.items()})
    server = ServerProcess(root / "data", root, env=env).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["inproc", pytest.param("uvicorn", marks=pytest.mark.slow)])
def limited_client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    """Like ``client``, but the server runs with the small ``LIMITS``."""
    if request.param == "inproc":
        with inproc_client(make_settings(tmp_path / "data", **LIMITS)) as c:
            yield c
    else:
        server: ServerProcess = request.getfixturevalue("limited_server")
        with server.client() as c:
            yield c


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own, so tests sharing one server never see each other."""
    return f"t-{uuid.uuid4().hex[:16]}"
