"""Inductor's local autotune cache keyed by this node's own Inductor cache dir.

Inductor keeps a kernel's autotune winner beside the kernel's source file:
``<dir of the kernel's .py>/<key>.best_config`` (``AutotuneCache._make_local_cache_key``), and
asks the remote autotune cache (kcache's ``autotune`` layer) only when that file is missing. A
statically launched autotuner loaded from an FX-graph entry (``TritonBundle.static_autotuners``)
carries the absolute ``filename`` of the *producer's* source file, so a warm node looks for the
winner in the producer's Inductor cache dir. Measured with torch 2.11 on an H100 (a ResNet-50
inference compile, 18 autotuned kernels, remote FX/AOTAutograd/autotune caches): a fresh node on
another host asks the remote cache for all 18; a fresh node on the same host as the producer
(own ``HOME``/``TMPDIR``: the bench's nodes, CI, jobs sharing a machine) reads the producer's 18
``.best_config`` files and asks for none, so kcache reported every prefetched autotune entry
"fetched, never asked for", and the node depended on another job's files (and would write its
own winners there on a miss).

A directory outside this process's Inductor cache dir is replaced here by the same
subdirectory of it (Inductor's layout: ``<cache dir>/<2 chars>/<hash>.py``): a node reads and
writes only its own files, as for a kernel it compiled itself, and a fresh node asks kcache.
Kernels under the node's own cache dir (its compiles, its own FX entries) keep their key.
Inductor's *remote* autotune key does not involve the path and is unchanged.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kcache_schemas import wire

from kcache.config import ClientConfig, selected_layers
from kcache.host import patching
from kcache.host.after_import import imported
from kcache.host.failopen import guard

PATCHES = "autotune-paths"


def own_dir(dirname: str, cache_dir: str) -> str:
    """``dirname`` if it lies inside ``cache_dir``, else ``cache_dir``'s subdirectory of the same name."""
    root = os.path.abspath(cache_dir)
    path = os.path.abspath(dirname)
    if path == root or path.startswith(root + os.sep):
        return dirname
    return os.path.join(root, os.path.basename(path))


def install() -> bool:
    """Wrap ``AutotuneCache._make_local_cache_key``; False (nothing changed) where this torch
    lacks it as a staticmethod of that shape."""
    if patching.is_patched(PATCHES):
        return True
    from torch._inductor.runtime import autotune_cache

    cls: Any = getattr(autotune_cache, "AutotuneCache", None)
    original = vars(cls).get("_make_local_cache_key") if isinstance(cls, type) else None
    if not isinstance(original, staticmethod):
        return False
    patching.patch(PATCHES, cls, "_make_local_cache_key", staticmethod(_wrap(original.__func__)))
    return True


def _wrap(original: Callable[[str, str], str]) -> Callable[[str, str], str]:
    @functools.wraps(original)
    def _make_local_cache_key(dirname: str, cache_key: str) -> str:
        with guard("could not key Inductor's local autotune cache by this node's dir; Inductor's key stands"):
            utils = imported("torch._inductor.runtime.runtime_utils")
            cache_dir = getattr(utils, "cache_dir", None)
            if isinstance(dirname, str) and callable(cache_dir):  # asked per call: TORCHINDUCTOR_CACHE_DIR may change
                dirname = own_dir(dirname, str(cache_dir()))
        return original(dirname, cache_key)  # torch's, unguarded

    return _make_local_cache_key


def uninstall() -> None:
    patching.restore(PATCHES)


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "autotune-paths"
STORES: tuple[str, ...] = ()  # keys Inductor's local autotune cache, so a fresh node asks the autotune layer


def selected(config: ClientConfig) -> bool:
    return wire.CacheLayer.AUTOTUNE.value in selected_layers(config.layers)


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install()
