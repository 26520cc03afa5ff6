"""The current environment's fingerprint (torch, triton, CUDA/HIP, GPU arch).

Computed without importing torch (package metadata; ``nvidia-smi`` for the arch), because the
workload prefetcher asks for it at interpreter start, on its own thread, often while the main
thread is inside ``import torch``. torch itself is asked only once its import has finished and it
has already initialised CUDA: kcache must not be the one to initialise the CUDA driver in a
process that may still fork workers.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from importlib import metadata

from kcache_schemas.models import EnvFingerprint

from kcache.after_import import imported

__all__ = ["EnvFingerprint", "current"]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _gpu_arch() -> str | None:
    if arch := os.environ.get("KCACHE_GPU_ARCH"):
        return arch
    torch = imported("torch")
    if torch is not None and _cuda_initialised(torch):
        try:
            if getattr(torch.version, "hip", None):
                return str(torch.cuda.get_device_properties(0).gcnArchName.split(":")[0])
            major, minor = torch.cuda.get_device_capability(0)
            return f"sm_{major}{minor}"
        except Exception:
            return None
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return f"sm_{lines[0].strip().replace('.', '')}" if lines else None


def _cuda_initialised(torch: object) -> bool:
    try:
        return bool(torch.cuda.is_initialized())  # type: ignore[attr-defined]
    except Exception:
        return False


@functools.lru_cache(maxsize=1)
def current() -> EnvFingerprint:
    torch_version = _version("torch")
    cuda = hip = None
    torch = imported("torch")
    if torch is not None:
        cuda = getattr(torch.version, "cuda", None)
        hip = getattr(torch.version, "hip", None)
    elif torch_version and "+cu" in torch_version:
        tag = torch_version.split("+cu", 1)[1]
        cuda = f"{tag[:-1]}.{tag[-1]}" if tag.isdigit() and len(tag) >= 2 else tag
    elif torch_version and "+rocm" in torch_version:
        hip = torch_version.split("+rocm", 1)[1]
    return EnvFingerprint(torch=torch_version, triton=_version("triton"), cuda=cuda, hip=hip, gpu_arch=_gpu_arch())
