"""Where Triton and Inductor look for kernel dirs, and what device this process runs on."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from kcache_schemas import KernelTarget


def triton_cache_dir(device: int = 0) -> Path:
    """``$TRITON_CACHE_DIR``, else Inductor's ``triton_cache_dir(device)``, else ``~/.triton/cache``."""
    if directory := os.environ.get("TRITON_CACHE_DIR"):
        return Path(directory)
    if "torch" in sys.modules:  # don't import torch just to learn a path
        try:
            from torch._inductor.runtime.runtime_utils import (  # type: ignore[attr-defined]
                triton_cache_dir as inductor_dir,
            )

            return Path(inductor_dir(device))
        except Exception:
            pass
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return Path(home) / ".triton" / "cache"


@functools.lru_cache(maxsize=1)
def local_target() -> tuple[str, str] | None:
    """``(device_type, arch)`` of the visible GPU, or None when none is visible (or torch is absent).

    Used to refuse kernels built for another GPU (vllm#41871: stale kernels after an arch change
    gave garbled output). Only asks torch if it is already imported.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        if getattr(torch.version, "hip", None):
            arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
            return ("hip", arch)
        major, minor = torch.cuda.get_device_capability(0)
        return ("cuda", f"{major}{minor}")
    except Exception:
        return None


def target_matches(target: KernelTarget, local: tuple[str, str] | None) -> bool:
    return local is None or (target.device_type.value, target.arch) == local
