"""Inductor's remote cache layers served by kcache.

Inductor builds each remote cache from a class in ``torch/_inductor/remote_cache.py`` and, when
that class's ``backend_override_cls`` is set, calls it instead of connecting to Redis. We set it
on each layer's class and switch the layer on, unless the user already chose (an explicit
``False`` stays ``False``), without changing any switch Inductor hashes into its cache keys (see
``OPT_IN`` and ``PREDICATES``). ``KCACHE_LAYERS`` (comma list) picks layers; default all.

Keys reach the backend already formatted by Inductor (``pt2:fx-graph-v1::<hash>:c1``): they are
content hashes, with no paths, hosts or ranks in them, so they hit across machines.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import sys
from types import ModuleType
from typing import Any

from kcache_schemas import InvalidKeyError, normalize_entry_key, wire

from kcache.config import ClientConfig, selected_layers
from kcache.current import get_runtime
from kcache.host import patching
from kcache.host.after_import import call_after_import, imported
from kcache.host.failopen import guard, warn_once
from kcache.layers import key_canary as canary
from kcache.layers.inductor import fx_graph_reads
from kcache.store import fx_graph_envelope

log = logging.getLogger("kcache.layers.inductor.remote_caches")

L = wire.CacheLayer
FX_GRAPH = L.FX_GRAPH.value
# layer -> (remote cache class, (config module, switch))
LAYERS: dict[str, tuple[str, tuple[str, str]]] = {
    FX_GRAPH: ("RemoteFxGraphCache", ("torch._inductor.config", "fx_graph_remote_cache")),
    L.AUTOTUNE.value: ("RemoteAutotuneCache", ("torch._inductor.config", "autotune_remote_cache")),
    L.BUNDLED_AUTOTUNE.value: ("RemoteBundledAutotuneCache", ("torch._inductor.config", "bundled_autotune_remote_cache")),
    L.AOT_AUTOGRAD.value: ("RemoteAOTAutogradCache", ("torch._functorch.config", "enable_remote_autograd_cache")),
    L.DYNAMO_PGO.value: ("RemoteDynamoPGOCache", ("torch._dynamo.config", "automatic_dynamic_remote_pgo")),
}
# Inductor's bundled autotune cache asserts on CPU-only hosts (torch 2.13: _get_backend_hash),
# so kcache serves it only where a GPU is visible; a cache must never break a compile.
GPU_ONLY = {L.BUNDLED_AUTOTUNE.value}
# Switches Inductor hashes into its own cache keys. Flipping one would make every graph compiled
# with kcache miss the local caches written without it, and back (KCACHE_MODE=off would mean a
# full recompile). Inductor's FX key ignores fx_graph_remote_cache and autotune_remote_cache, but
# not bundled_autotune_remote_cache: kcache serves that layer only if the user switches it on (the
# autotune layer carries the same winners, per kernel). AOTAutograd pickles all of
# torch._functorch.config into its key: kcache leaves enable_remote_autograd_cache unset and
# answers AOTAutograd's "use the remote cache?" question (the predicate below) instead.
OPT_IN = {L.BUNDLED_AUTOTUNE.value}
# Layers a warm node mostly never asks: its FX-graph entry brings the kernels' static autotuners,
# saved after autotuning with the winner alone, and Inductor rechecks the autotune cache only for
# an autotuner with more than one config or coordinate-descent tuning (torch 2.11,
# CachingAutotuner.recheck_autotune_cache -> check_autotune_cache). Measured on an H100: bert's 6
# and resnet50's 18 autotune entries prefetched on every warm node, none asked for. So what a
# producer writes to these is not listed in the workload (the next job would download it for
# nothing); what a node reads from them is (kcache.runtime.get_entry): where nodes do ask
# (coordinate descent, an FX-graph miss, a layer selection without FX graphs) the entries are
# prefetched from the run after the first that asked, and served on demand until then.
LISTED_WHEN_READ = frozenset({L.AUTOTUNE.value, L.BUNDLED_AUTOTUNE.value})
# layer -> (module, predicate, modules that import it by name): wrapped to say yes while kcache
# serves the layer and the switch is unset
PREDICATES = {
    L.AOT_AUTOGRAD.value: (
        "torch._functorch._aot_autograd.autograd_cache",
        "should_use_remote_autograd_cache",
        ("torch._functorch._aot_autograd.graph_compile", "torch._functorch.aot_autograd"),
    )
}
PATCHES = "remote-caches"
# KCACHE_LAYERS names these layers, Dynamo's precompile packages (kcache.layers.dynamo.packages: torch has
# no remote-cache class for them), JIT builders' native modules (kcache.layers.jit.layer) and vLLM's
# compile cache (kcache.layers.vllm_compile_cache):
# kcache.config.SELECTABLE_LAYERS, parsed there.


def service_key(key: str) -> str:
    """Inductor's key if it is URL-safe, else a stable hash of it."""
    try:
        return normalize_entry_key(key)
    except InvalidKeyError:
        return "h:" + hashlib.sha256(key.encode()).hexdigest()


def _compile_time_s(data: bytes) -> float | None:
    """FX-graph and AOTAutograd entries are ``json.dumps({"data": <base64>, "time_taken_ms": N})``:
    credit N as compile time saved."""
    return fx_graph_envelope.recorded_compile_time_s(data)


def _backend_base() -> type:
    from torch._inductor.remote_cache import RemoteCacheBackend

    return RemoteCacheBackend


@functools.lru_cache(maxsize=1)
def backend_class() -> type:
    base = _backend_base()

    class KcacheRemoteCacheBackend(base):  # type: ignore[misc, valid-type]
        """A ``RemoteCacheBackend[bytes]`` that fails open: errors read as misses to Inductor
        (and are counted as errors by kcache), so a dead service never fails a compile."""

        def __init__(self, layer: str) -> None:
            super().__init__()
            self.layer = layer
            if layer == FX_GRAPH:
                # Now, not at install(): kcache installs while torch._inductor.codecache may
                # still be importing, and Inductor builds this backend right before a lookup.
                _install_fast_reads()

        def get_stored(self, key: str) -> bytes | None:
            """The entry as stored (for FX graphs usually the raw-pickle envelope)."""
            with guard(f"{self.layer} lookup failed"):
                rt = get_runtime()
                stored = None if rt is None else rt.get_entry(self.layer, service_key(key))
                if stored is not None and rt is not None and rt.config.canary > 0:
                    canary.note_served(self.layer, service_key(key), stored)
                return stored
            return None

        def _get(self, key: str) -> bytes | None:
            stored = self.get_stored(key)
            if stored is None:
                return None
            with guard(f"{self.layer} entry unreadable"):
                return fx_graph_envelope.inductor_json(stored)
            return None

        def _put(self, key: str, data: bytes) -> None:
            with guard(f"{self.layer} store failed"):
                rt = get_runtime()
                if rt is None:
                    return
                if self.layer == FX_GRAPH and rt.config.canary > 0 and canary.fx_compiled(service_key(key), data):
                    return  # an audited hit's own compile: compared, never uploaded over the entry
                compile_time = _compile_time_s(data)
                if self.layer == FX_GRAPH:
                    # The envelope is made in the uploader thread: decoding Inductor's JSON and
                    # base64 of a max-autotune graph (hundreds of MB) is not the compile's work.
                    rt.put_entry(self.layer, service_key(key), functools.partial(fx_graph_envelope.stored_form, data), compile_time)
                else:
                    rt.put_entry(self.layer, service_key(key), data, compile_time, record=self.layer not in LISTED_WHEN_READ)

    return KcacheRemoteCacheBackend


def served_layers() -> list[str]:
    """The layers whose backend kcache has in place now: read from Inductor's classes (what the
    patch registry put there), never kept beside them, so an ``uninstall()`` leaves none served
    and a later ``install()`` serves what it selects, as in a fresh process."""
    remote_cache = sys.modules.get("torch._inductor.remote_cache")
    if remote_cache is None or not patching.is_patched(PATCHES):
        return []
    backend = backend_class()
    return sorted(layer for layer, (cls_name, _switch) in LAYERS.items()
                  if _is_ours(getattr(getattr(remote_cache, cls_name, None), "backend_override_cls", None), backend, layer))


def _is_ours(override: Any, backend: type, layer: str) -> bool:
    return isinstance(override, functools.partial) and override.func is backend and override.args == (layer,)


def _install_fast_reads() -> None:
    if FX_GRAPH not in served_layers():
        return  # uninstalled since this backend was built
    with guard("could not hook FxGraphCache.iterate_over_candidates; FX graphs are read through JSON"):
        fx_graph_reads.install_fast_reads(lambda backend: isinstance(backend, backend_class()))


def _gpu_visible() -> bool:
    """Asked on the installing thread (the main thread, inside or after torch's import)."""
    torch = imported("torch") or sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


def install_remote_caches(layers: list[str]) -> list[str]:
    """Serve each selected layer whose class and switch this torch has; returns those served."""
    if patching.is_patched(PATCHES):
        return served_layers()
    remote_cache = importlib.import_module("torch._inductor.remote_cache")
    backend = backend_class()
    gpu = _gpu_visible()
    for layer in layers:
        if layer not in LAYERS:
            continue  # served elsewhere (the dynamo layer)
        if layer in GPU_ONLY and not gpu:
            continue
        cls_name, (config_module, switch) = LAYERS[layer]
        cls = getattr(remote_cache, cls_name, None)
        try:
            config = importlib.import_module(config_module)
        except ImportError:
            config = None
        if cls is None or config is None or not hasattr(config, switch) or not hasattr(cls, "backend_override_cls"):
            warn_once(f"this torch has no {cls_name}.backend_override_cls/{switch}; layer {layer} not served")
            continue
        previous = getattr(config, switch)
        patching.patch(PATCHES, cls, "backend_override_cls", functools.partial(backend, layer))
        # Unset: kcache turns the layer on; an explicit choice (True or False) stands.
        if layer in PREDICATES:
            call_after_import(PREDICATES[layer][0], functools.partial(_wrap_predicate, layer))
        elif previous is None and layer not in OPT_IN:
            patching.patch(PATCHES, config, switch, True)
    return served_layers()


def _wrap_predicate(layer: str, module: Any) -> None:
    with guard(f"could not answer the {layer} layer's remote-cache predicate; that layer is not served"):
        _, name, importers = PREDICATES[layer]
        original = module.__dict__.get(name)
        if layer not in served_layers() or getattr(original, "__wrapped__", None) is not None or not callable(original):
            return  # uninstalled before the module loaded, already wrapped, or a torch without it
        config = importlib.import_module(LAYERS[layer][1][0])
        switch = LAYERS[layer][1][1]

        def predicate(*args: Any, **kwargs: Any) -> bool:
            return True if getattr(config, switch, False) is None else bool(original(*args, **kwargs))

        predicate.__wrapped__ = original  # type: ignore[attr-defined]
        patching.patch(PATCHES, module, name, predicate)
        # Modules that imported the name before we got here hold the original: point them at ours.
        for other in _importers(importers):
            if other.__dict__.get(name) is original:
                patching.patch(PATCHES, other, name, predicate)


def _importers(names: tuple[str, ...]) -> list[Any]:
    return [sys.modules[n] for n in names if n in sys.modules]


def uninstall_remote_caches() -> None:
    patching.restore(PATCHES)
    fx_graph_reads.uninstall_fast_reads()


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "inductor-remote-caches"
STORES = tuple(LAYERS)


def selected(config: ClientConfig) -> bool:
    return True  # which of Inductor's caches: install_remote_caches reads KCACHE_LAYERS


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install_remote_caches(selected_layers(config.layers))


def uninstall() -> None:
    uninstall_remote_caches()  # also forgets the layers a later-loading module would serve
