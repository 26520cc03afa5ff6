"""The current environment's fingerprint (torch, triton, CUDA/HIP, GPU arch).

A workload is published under the fingerprint its job computed at exit and prefetched under the
one the next job computes at interpreter start, often on the prefetch thread while the main thread
is inside ``import torch``. Both must agree, so the fingerprint is a function of what is installed
and of the machine, never of how far torch got importing: package metadata for the versions,
``torch/version.py`` read as text for CUDA/HIP (registry CUDA wheels carry no ``+cu`` tag in their
version), ``KCACHE_GPU_ARCH`` or ``nvidia-smi`` for the arch. torch is never imported or called:
kcache must also not be the one to initialise the CUDA driver in a process that may still fork.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from kcache_schemas.models import EnvFingerprint

from kcache.config import gpu_arch_override

__all__ = ["EnvFingerprint", "current"]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _torch_build() -> dict[str, str | None]:
    """``cuda`` and ``hip`` from the installed ``torch/version.py``, read as text (no import)."""
    try:
        spec = importlib.util.find_spec("torch")  # a top-level name: finds, imports nothing
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        source = (Path(locations[0]) / "version.py").read_text() if locations else ""
        tree = ast.parse(source)
    except (OSError, ValueError, SyntaxError, ImportError):
        return {}
    found: dict[str, str | None] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        value = node.value if isinstance(node, (ast.AnnAssign, ast.Assign)) else None
        if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and isinstance(value, ast.Constant):
            found[target.id] = value.value if isinstance(value.value, str) else None
    return found


def _gpu_arch() -> str | None:
    if arch := gpu_arch_override():
        return arch
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return f"sm_{lines[0].strip().replace('.', '')}" if lines else None


@functools.lru_cache(maxsize=1)
def packages() -> dict[str, str | None]:
    """torch, triton, cuda, hip from installed files. Cheap, but it imports importlib.metadata's
    parsers on first use: the workload prefetcher asks for it on the thread that starts it."""
    build = _torch_build()
    return {"torch": _version("torch"), "triton": _version("triton"), "cuda": build.get("cuda"), "hip": build.get("hip")}


@functools.lru_cache(maxsize=1)
def current() -> EnvFingerprint:
    return EnvFingerprint(**packages(), gpu_arch=_gpu_arch())
