"""Pre-emit (``kcache.layers.inductor.kernel_preemit``) in real interpreters: a fresh node whose
workload lists kernels finds them written into the dir Inductor will use, before its first
compile asks, in the user's default environment (only ``KCACHE_URL``/``KCACHE_WORKLOAD`` set,
every dir under the node's ``HOME``/``TMPDIR``); a job that chooses its own Inductor dir after
``import torch`` gets them there, and keeps its choice.

``KCACHE_GPU_ARCH=90`` stands in for the GPU these CPU machines lack (the kernels are real sm_90
builds): with it the target check needs no CUDA, which the pre-emit otherwise waits for the job
to initialize."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kcache_schemas.pack import read_kernel_dir

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S
from kcache_testkit.service import ServerProcess, clean_env, with_testkit

pytest.importorskip("torch")
# Inductor's dir and the moment kcache activates are torch's: the matrix runs it too.
pytestmark = [pytest.mark.slow, pytest.mark.torch]

JOB = Path(__file__).with_name("preemit_job.py")
WORKLOAD = "pre-emit"


def _consume(node: Node, url: str, **env: str) -> dict[str, Any]:
    """A consumer node, read-only: what it compiles stays out of the workload, so each test sees
    the producer's three kernels whatever ran before it."""
    return _job(node, JOB_ROLE="consume", KCACHE_URL=url, KCACHE_WORKLOAD=WORKLOAD, KCACHE_MODE="read-only", **env)


def _job(node: Node, **env: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(JOB)], env=with_testkit(node.env(KCACHE_GPU_ARCH="90", **env)),
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "kcache:" not in proc.stderr, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[str]]]:
    """A service holding a workload of three real kernels, published by a producer node."""
    root = tmp_path_factory.mktemp("pre-emit")
    with ServerProcess(root / "data", root, env=clean_env()) as srv:
        producer = Node(root / "producer")
        made = _job(producer, JOB_ROLE="produce", KCACHE_URL=srv.url, KCACHE_WORKLOAD=WORKLOAD,
                    TRITON_CACHE_DIR=str(producer.root / "triton"))
        assert made["stats"]["kernel"]["puts"] == 3, made["stats"]
        yield srv.url, producer.root / "triton", made["keys"]


def _whole(cache_dir: Path, key: str, producer_dir: Path) -> bool:
    """The dir holds the producer's kernel, with this dir's own paths in its group file."""
    emitted, original = read_kernel_dir(cache_dir / key), read_kernel_dir(producer_dir / key)
    group = next(name for name in emitted if name.startswith("__grp__"))
    children = json.loads((cache_dir / key / group).read_text())["child_paths"]
    return emitted == original and all(Path(p).parent == cache_dir / key for p in children.values())


def test_a_fresh_node_finds_its_kernels_in_inductors_dir_before_the_first_compile(fleet: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    url, producer_dir, keys = fleet
    node = Node(tmp_path / "fresh")
    got = _consume(node, url, LOCAL_RANK="1")
    expected = node.root / "tmp" / f"torchinductor_{getpass.getuser()}" / "triton" / "1"  # torchrun's rank 1
    assert got["started"] and got["pre_emitted"] == 3 and got["dir"] == str(expected), got
    assert all(_whole(expected, key, producer_dir) for key in keys)
    assert got["out"] == [3.0, 3.0, 3.0]
    assert "kernel" not in got["stats"]  # written ahead, not served: used once Inductor finds one


def test_a_job_that_chooses_its_inductor_dir_after_import_gets_them_there(fleet: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    url, producer_dir, keys = fleet
    node = Node(tmp_path / "chooser")
    chosen = tmp_path / "my-inductor-cache"
    got = _consume(node, url, SET_INDUCTOR_DIR=str(chosen))
    assert got["pre_emitted"] == 3 and got["dir"] == str(chosen / "triton" / "0"), got
    assert all(_whole(chosen / "triton" / "0", key, producer_dir) for key in keys)
    assert got["inductor_dir_before_first_call"] == str(chosen)
    assert not (node.root / "tmp" / f"torchinductor_{getpass.getuser()}" / "triton").exists()


def test_nothing_is_written_ahead_where_entries_are_signed(fleet: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    """The bundle hook takes a dir it finds whole by its files' sizes; a kernel pack is unsigned,
    so with signing configured a pre-emitted dir would stand in for a signed FX entry's kernels."""
    url, _producer_dir, _keys = fleet
    node = Node(tmp_path / "signed")
    got = _consume(node, url, KCACHE_SIGNING_KEY="fleet-secret")
    assert not got["started"] and got["pre_emitted"] == 0, got
    assert not (node.root / "tmp" / f"torchinductor_{getpass.getuser()}" / "triton").exists()
    assert got["out"] == [3.0, 3.0, 3.0]
