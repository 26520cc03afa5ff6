"""The one interface of a cache layer: a module that serves one of the host's caches.

A layer is a module (PEP 544 lets a module implement a protocol; mypy checks every registered
module against :class:`Layer` in :mod:`kcache.layers.layer_registry`) with:

* ``NAME``: what ``kcache doctor`` and people call it;
* ``STORES``: the wire layers (``kcache_schemas.wire.CacheLayer`` values) it stores entries
  under: what it stores, and its counters, which are the stats rows of those names (a hook that
  stores nothing of its own has none);
* ``selected(config)``: whether this process's settings (``KCACHE_LAYERS``, its own switch) want it;
* ``install_layer(config, hooked)``: hook it into torch, Triton or vLLM. ``hooked`` is the host
  module whose import just finished, when the ``.pth``'s import hook hands it over (a layer that
  hooks a module lazily may hook that one at once); most layers ignore it. Each layer's own
  ``install`` keeps the arguments it had; ``install_layer`` adapts it to this one shape;
* ``uninstall()``: unhook, after handing over what it still holds.

Activation (:mod:`kcache.activation`) walks the registry: it installs each layer in order, each
inside its own fail-open guard, and uninstalls them in reverse. Every attribute a layer replaces
goes through :mod:`kcache.host.patching`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from types import ModuleType

    from kcache.config import ClientConfig


class Layer(Protocol):
    @property
    def NAME(self) -> str: ...

    @property
    def STORES(self) -> tuple[str, ...]: ...

    def selected(self, config: ClientConfig) -> bool: ...

    def install_layer(self, config: ClientConfig, hooked: ModuleType | None = None) -> None: ...

    def uninstall(self) -> None: ...
