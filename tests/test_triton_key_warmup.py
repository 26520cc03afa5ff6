"""Triton's key hashed ahead (``kcache.layers.triton.key_warmup``) in real interpreters, in the
user's default environment (only ``KCACHE_URL`` set, every dir under the node's ``HOME``/``TMPDIR``):
a GPU job finds ``triton_key()`` computed before its first compile asks; a CPU job never computes
it; and the warm-up never imports a package the key would walk.

``KCACHE_GPU_ARCH=90`` stands in for the GPU these CPU machines lack (the warm-up otherwise waits
for the job to initialize CUDA, which is how it knows a job is a GPU job)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S
from kcache_testkit.service import ServerProcess, clean_env, with_testkit

pytest.importorskip("triton")
pytest.importorskip("torch")
# Where Triton defines its key and where torch takes it from differ by version: the matrix runs it.
pytestmark = [pytest.mark.slow, pytest.mark.torch]

JOB = Path(__file__).with_name("key_warmup_job.py")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("key-warmup")
    with ServerProcess(root / "data", root, env=clean_env()) as srv:
        yield srv.url


def _job(node: Node, url: str, **env: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(JOB)], env=with_testkit(node.env(KCACHE_URL=url, **env)),
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "kcache:" not in proc.stderr, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])  # type: ignore[no-any-return]


def test_a_gpu_job_finds_tritons_key_computed_before_it_asks(url: str, tmp_path: Path) -> None:
    got = _job(Node(tmp_path / "gpu"), url, KCACHE_GPU_ARCH="90")
    assert got["outcome"] == "hashed" and got["seconds"] > 0, got
    assert got["cached"] == 1 and got["computed"] == 1, got  # by kcache's thread, in torch's cache
    assert got["key_is_triton_version_and_hashes"] and got["computed_after_asking"] == 1, got  # torch's ask: a hit
    assert got["out"] == [3.0, 3.0, 3.0]


def test_a_cpu_job_never_computes_it(url: str, tmp_path: Path) -> None:
    got = _job(Node(tmp_path / "cpu"), url, KCACHE_PREFETCH_WAIT_S="0.3")
    assert got["outcome"] == "not a GPU job" and got["cached"] == 0 and got["computed"] == 0, got
    assert got["out"] == [3.0, 3.0, 3.0]


def test_the_warm_up_imports_nothing_it_would_walk(url: str, tmp_path: Path) -> None:
    """``triton_key`` imports every package it walks; one the job has not imported stays so."""
    got = _job(Node(tmp_path / "partial"), url, KCACHE_GPU_ARCH="90", FORGET_PACKAGE="triton.backends.amd",
               KCACHE_PREFETCH_WAIT_S="0.5")
    assert got["outcome"] == "triton not imported" and got["computed"] == 0, got
    assert not got["forgotten_back"], got
