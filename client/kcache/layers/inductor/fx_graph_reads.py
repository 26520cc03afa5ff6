"""The ``fx-graph`` layer's read path: kcache's raw-pickle entries go straight to ``pickle.loads``.

kcache stores an FX-graph entry as its pickle in an envelope (:mod:`kcache.store.fx_graph_envelope`).
It reads it by wrapping ``FxGraphCache.iterate_over_candidates`` (Inductor's local candidates first,
unchanged), so the pickle goes straight to ``pickle.loads`` like a local hit, without Inductor's
JSON and base64 decoding of a remote entry.
"""

from __future__ import annotations

import inspect
import pickle
import re
from collections.abc import Generator
from typing import Any

from kcache.host import patching
from kcache.host.failopen import guard, warn_once
from kcache.store.fx_graph_envelope import pickled_graph

PATCHES = "fx-fast-reads"
_PARAMETERS = ["local", "remote_cache", "key"]


def candidate_arity(iterate: Any) -> int | None:
    """How many values ``iterate_over_candidates`` yields per candidate, read from its signature
    (``Generator[tuple[T, bytes, bool], None, None]`` on torch 2.13: 3), or None when its
    parameters or annotation are not a shape we know. Feature detection, not version checks."""
    try:
        sig = inspect.signature(iterate)
    except (TypeError, ValueError):
        return None
    parameters = list(sig.parameters)
    if parameters[:1] == ["cls"]:  # the plain function rather than the bound classmethod
        parameters = parameters[1:]
    if parameters != _PARAMETERS:
        return None
    annotation = sig.return_annotation
    text = annotation if isinstance(annotation, str) else repr(annotation)
    match = re.search(r"[Tt]uple\[(.*?)\]", text)
    if match is None:
        return None
    parts = [p.strip() for p in match.group(1).split(",")]
    shapes = {("T", "bytes", "bool"): 3, ("T", "bytes"): 2}
    return shapes.get(tuple(parts[:1] + [p.split(".")[-1] for p in parts[1:]]))


def install_fast_reads(is_kcache_backend: Any) -> bool:
    """Wrap ``FxGraphCache.iterate_over_candidates``: when the remote cache is kcache's, read
    its entry as a raw pickle. False (nothing changed, one warning) where this torch lacks the
    method or it has a shape we do not know: Inductor's JSON path then reads every entry."""
    if patching.is_patched(PATCHES):
        return True
    from torch._inductor.codecache import FxGraphCache

    original = getattr(FxGraphCache, "iterate_over_candidates", None)
    arity = candidate_arity(original) if original is not None else None
    if original is None or arity is None or not hasattr(original, "__func__"):
        warn_once("this torch's FxGraphCache.iterate_over_candidates has a shape kcache does not know; FX-graph entries are read through Inductor's JSON")
        return False
    iterate = original.__func__

    def iterate_over_candidates(cls: Any, local: bool, remote_cache: Any, key: str) -> Generator[tuple[Any, ...], None, None]:
        backend: Any = getattr(remote_cache, "backend", None)
        if remote_cache is None or not is_kcache_backend(backend):
            yield from iterate(cls, local, remote_cache, key)
            return
        yield from iterate(cls, local, None, key)  # local candidates, as Inductor reads them
        candidate: tuple[Any, ...] | None = None
        # Inductor logs and skips a remote entry it cannot load; so do we.
        with guard("could not load an FX-graph entry from kcache; Inductor compiles it"):
            # RemoteCache.get formats the key (``pt2:fx-graph-v1::<key>:c1``) before its backend sees it.
            get_key = getattr(remote_cache, "_get_key", None)
            stored = backend.get_stored(get_key(key) if get_key is not None else key)
            _count_inductor_get(remote_cache, stored)
            if stored is not None:
                content = pickled_graph(stored)
                candidate = (pickle.loads(content), content, False)[:arity]
        if candidate is not None:
            yield candidate

    patching.patch(PATCHES, FxGraphCache, "iterate_over_candidates", classmethod(iterate_over_candidates))
    return True


def _count_inductor_get(remote_cache: Any, stored: bytes | None) -> None:
    """Keep Inductor's own remote-cache counters (``TORCH_LOGS=cache``) as its get() would."""
    try:
        from torch._inductor.remote_cache import cache_stats

        cache_stats.get(type(remote_cache).__name__, stored)
    except Exception:
        pass


def uninstall_fast_reads() -> None:
    patching.restore(PATCHES)
