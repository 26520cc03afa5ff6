"""What a compile's FX-graph key is made of, recorded where the key missed.

Inductor's ``FxGraphCache.load_with_key`` looks a graph up locally and remotely and returns
``(graph, cache_info)``; on a miss ``cache_info`` carries the key and its parts as Inductor's
debug lines (``[hash] inductor_config[fallback_random]: False``, ...), the same on torch 2.9, 2.13
and 2.15. Inductor compiles right after a miss. kcache wraps the method and, on a miss:

* counts it in the process's stats (``missed``: what ``kcache explain --file/--run`` explains),
* uploads the parts beside the key (the ``key-components`` layer) so any node can explain a
  later miss against this key (the key is then also this node's compiled entry), with what the
  compile depended on beyond the key (:mod:`kcache.layers.key_context`),
* lets the must-hit guard (:mod:`kcache.layers.require_hit`) warn about or fail the compile.

On a hit kcache served, the key-soundness canary (:mod:`kcache.layers.key_canary`, ``KCACHE_CANARY``) may
turn the answer into a miss so that Inductor compiles the graph and the two can be compared.

An unknown shape of the method or of its answer leaves Inductor alone (one warning).
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from kcache_schemas import wire
from kcache_schemas.key_diff import KeyComponents, from_parts, parse_debug_lines

from kcache.config import ClientConfig
from kcache.current import get_runtime
from kcache.host import patching
from kcache.host.after_import import call_after_import
from kcache.host.failopen import guard, warn_once
from kcache.layers import key_canary as canary
from kcache.layers import key_context, require_hit

PATCHES = "key-components"
LAYER = wire.CacheLayer.FX_GRAPH.value
CODECACHE = "torch._inductor.codecache"


def _missed(answer: Any) -> KeyComponents | None:
    """The key and parts of a lookup that missed, from ``load_with_key``'s answer; else None."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], dict)):
        return None
    info = answer[1]
    if info.get("cache_state") != "miss" or not isinstance(info.get("key"), str):
        return None
    lines = info.get("components")
    parts = parse_debug_lines(line for line in lines if isinstance(line, str)) if isinstance(lines, list) else {}
    context = from_parts(LAYER, info["key"], key_context.fx_graph(parts)).components if parts else {}
    return KeyComponents(layer=LAYER, key=info["key"], components=parts, context=context)


def _hook(codecache: ModuleType) -> None:
    if patching.is_patched(PATCHES) or get_runtime() is None:
        return  # hooked already, or uninstalled before torch's codecache finished importing
    cache_cls = getattr(codecache, "FxGraphCache", None)
    original = inspect.getattr_static(cache_cls, "load_with_key", None) if cache_cls is not None else None
    if not isinstance(original, staticmethod):
        warn_once("this torch's FxGraphCache.load_with_key is not the one kcache knows; misses are not explained")
        return
    load_with_key = original.__func__
    if list(inspect.signature(load_with_key).parameters)[:2] != ["key", "debug_lines"]:
        warn_once("this torch's FxGraphCache.load_with_key takes other arguments; misses are not explained")
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        answer = load_with_key(*args, **kwargs)
        missed: KeyComponents | None = None
        with guard("could not record an FX-graph miss"):
            missed = _missed(answer)
            rt = get_runtime()
            if missed is not None and rt is not None:
                rt.record_miss(missed)
        if missed is not None:
            # Outside the guard on purpose: KCACHE_REQUIRE_HIT=fail raises into the compile.
            require_hit.compile_ahead(LAYER, missed)
        with guard("kcache's canary could not audit an FX-graph hit; the hit is used"):
            # A hit the canary audits reads as a miss from here on: Inductor compiles it (not a
            # miss to record or to refuse under KCACHE_REQUIRE_HIT: the entry was there).
            key = args[0] if args else kwargs.get("key")
            if isinstance(key, str):
                answer = canary.fx_lookup(answer, key)
        return answer

    patching.patch(PATCHES, cache_cls, "load_with_key", staticmethod(wrapper))


def install() -> None:
    """Wrap Inductor's FX-graph lookup once torch's codecache has finished importing."""
    if not patching.is_patched(PATCHES):
        call_after_import(CODECACHE, _hook)


def uninstall() -> None:
    patching.restore(PATCHES)


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "key-components"
STORES = (wire.CacheLayer.KEY_COMPONENTS.value,)


def selected(config: ClientConfig) -> bool:
    return True


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install()
