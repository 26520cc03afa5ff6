"""Running the ``jit`` layer's jobs (``cpu_jit_job.py``: a ``torch.compile`` on the CPU;
``cpp_extension_job.py``: a ``load_inline`` extension; ``tvm_ffi_job.py``: a tvm-ffi module) on
user-like nodes, with every compiler run recorded: what tests/test_jit_*.py assert on and
bench/cpu_jit.py times."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache_testkit.compilers import CompilerShim, make_shim
from kcache_testkit.nodes import Node

JOB = Path(__file__).with_name("cpu_jit_job.py")
EXTENSION_JOB = Path(__file__).with_name("cpp_extension_job.py")  # torch cpp_extension.load_inline
TVM_FFI_JOB = Path(__file__).with_name("tvm_ffi_job.py")  # tvm_ffi.cpp.load_inline
REPO = Path(__file__).resolve().parent.parent


@dataclass
class JobRun:
    first_call_s: float
    out: list[float]
    stderr: str
    calls: list[list[str]]  # every compiler run (kcache_testkit.compilers)
    builds: list[list[str]]  # the runs that were not version probes
    stats: dict[str, Any] = field(default_factory=dict)  # the kcache stats document, if written

    def layer(self, name: str) -> dict[str, Any]:
        layers: dict[str, Any] = self.stats.get("layers", {})
        return dict(layers.get(name) or {})


def run_job(node: Node, timeout: float = 600, job: Path = JOB, **settings: str) -> JobRun:
    """``job`` as a fresh interpreter on ``node`` with ``settings`` (``KCACHE_URL`` etc.), the
    compiler shim first on its ``PATH``, kcache stats written under the node."""
    run_dir = node.root / f"run-{len(list(node.root.glob('run-*')))}"
    run_dir.mkdir(parents=True)
    shim: CompilerShim = make_shim(run_dir / "bin", run_dir / "compiler-calls.log")
    stats = run_dir / "stats.json"
    env = node.env(**settings)
    env["PATH"] = shim.path(env.get("PATH", ""))
    if "KCACHE_URL" in settings:
        env["KCACHE_STATS_FILE"] = str(stats)
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, str(job)], env=env, cwd=node.root, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or "Traceback" in proc.stderr:
        raise AssertionError(f"job failed on {node.root} (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    return JobRun(result["first_call_s"], result["out"], proc.stderr, shim.calls(), shim.builds(),
                  json.loads(stats.read_text()) if stats.exists() else {})


def inductor_dirs(node: Node) -> list[Path]:
    """Inductor's cache dirs of ``node`` (``$TMPDIR/torchinductor_<user>``: its default)."""
    return sorted((node.root / "tmp").glob("torchinductor_*"))


def copy_warm(source: Node, dest: Node) -> None:
    """What users do today: a fresh node with the warm node's Inductor cache dirs copied in."""
    (dest.root / "tmp").mkdir(parents=True, exist_ok=True)
    for d in inductor_dirs(source):
        shutil.copytree(d, dest.root / "tmp" / d.name, symlinks=True)
