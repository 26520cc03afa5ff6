"""Triton's kernel cache as a layer: kcache's tiered cache manager
(:mod:`kcache.layers.triton.cache_manager`), switched on through ``TRITON_CACHE_MANAGER``.

Set in the environment, so Inductor's compile worker processes inherit it, and never by importing
the manager (it imports Triton). A manager the user chose stays. ``kcache._autoload`` sets the
same value at interpreter start, spelled there because it may import nothing."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kcache_schemas import wire

if TYPE_CHECKING:
    from types import ModuleType

    from kcache.config import ClientConfig

NAME = "triton-cache-manager"
STORES = (wire.CacheLayer.KERNEL.value, wire.CacheLayer.TRITON_MODULE.value)
TRITON_MANAGER = "kcache.triton_manager:KcacheCacheManager"


def selected(config: ClientConfig) -> bool:
    return config.triton_manager  # KCACHE_TRITON_MANAGER


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    os.environ.setdefault("TRITON_CACHE_MANAGER", TRITON_MANAGER)


def uninstall() -> None:
    if os.environ.get("TRITON_CACHE_MANAGER") == TRITON_MANAGER:
        del os.environ["TRITON_CACHE_MANAGER"]
