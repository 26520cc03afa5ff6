"""Where Triton and Inductor look for kernel dirs, and what device this process runs on.

Both are facts about the user's environment that torch knows best, and both are asked from
threads kcache does not control: they consult torch only once its import has finished
(:func:`kcache.host.after_import.imported`), never import it, and never cache an answer given while
torch was absent or half imported (a process that cached "no GPU" would run with the arch check
off for good).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from kcache_schemas import KernelTarget

from kcache.config import gpu_arch_override
from kcache.host.after_import import imported

_INDUCTOR_DIRS = ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils")


def triton_cache_dir(device: int = 0) -> Path:
    """``$TRITON_CACHE_DIR``, else Inductor's ``triton_cache_dir(device)`` if Inductor's runtime
    utilities have finished importing, else Triton's own default ``~/.triton/cache``."""
    if directory := os.environ.get("TRITON_CACHE_DIR"):
        return Path(directory)
    for name in _INDUCTOR_DIRS:  # torch >= 2.11 keeps it in cache_dir_utils, re-exported before
        module = imported(name)
        inductor_dir = getattr(module, "triton_cache_dir", None)
        if inductor_dir is not None:
            try:
                return Path(inductor_dir(device))
            except Exception:
                break
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return Path(home) / ".triton" / "cache"


def inductor_triton_dir(device: int) -> Path | None:
    """The dir Inductor's ``triton_cache_dir(device)`` will name, without calling it: its
    ``cache_dir()`` exports ``TORCHINDUCTOR_CACHE_DIR`` as a side effect, which would pin the
    dir before the job's own code ran. None while ``TRITON_CACHE_DIR`` is set (Triton's own dir
    then, not Inductor's) or Inductor's runtime utilities have not finished importing."""
    if os.environ.get("TRITON_CACHE_DIR") is not None:
        return None
    for name in _INDUCTOR_DIRS:
        default_cache_dir = getattr(imported(name), "default_cache_dir", None)
        if default_cache_dir is not None:
            base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            return Path(os.path.abspath(base if base is not None else default_cache_dir())) / "triton" / str(device)
    return None


_target_lock = threading.Lock()
_target: list[tuple[str, str] | None] = []  # filled once, from a fully imported torch


def local_target() -> tuple[str, str] | None:
    """``(device_type, arch)`` of the visible GPU, or None when none is visible or torch is not
    (yet) fully imported.

    Used to refuse kernels built for another GPU (vllm#41871: stale kernels after an arch change
    gave garbled output). ``KCACHE_GPU_ARCH`` (``90``, ``sm_90``, ``gfx90a``) answers without torch.
    """
    if arch := gpu_arch_override():
        arch = arch.removeprefix("sm_")
        return ("hip", arch) if arch.startswith("gfx") else ("cuda", arch)
    with _target_lock:
        if _target:
            return _target[0]
        torch = imported("torch")
        if torch is None:
            return None  # not cached: ask again once torch is there
        _target.append(_ask_torch(torch))
        return _target[0]


def _ask_torch(torch: object) -> tuple[str, str] | None:
    try:
        cuda = torch.cuda  # type: ignore[attr-defined]
        if not cuda.is_available():
            return None
        if getattr(torch.version, "hip", None):  # type: ignore[attr-defined]
            return ("hip", str(cuda.get_device_properties(0).gcnArchName.split(":")[0]))
        major, minor = cuda.get_device_capability(0)
        return ("cuda", f"{major}{minor}")
    except Exception:
        return None


def target_matches(target: KernelTarget, local: tuple[str, str] | None) -> bool:
    return local is None or (target.device_type.value, target.arch) == local
