"""FX-graph entries stored as raw pickles, and the read path that unpickles them directly.

Inductor hands its remote FX-graph cache ``json.dumps({"data": base64(pickle), "time_taken_ms":
N})`` and reads it back through ``json.loads`` and ``base64.b64decode``. A max-autotune graph
carries every kernel of its TritonBundle: GPT-2 6L's pickle is 180 MB, its JSON 240 MB, and a warm
H100 node spent ~0.7 s decoding it (``a2b_base64`` alone 0.35 s) before unpickling — work a node
with a local cache never does.

So kcache stores the pickle raw in an envelope (``MAGIC``, the length of a JSON header holding the
entry's other fields, the header, the pickle): a quarter smaller on the wire and in storage. It
reads it by wrapping ``FxGraphCache.iterate_over_candidates`` (Inductor's local candidates first,
unchanged), so the pickle goes straight to ``pickle.loads`` like a local hit. Every other reader
gets Inductor's JSON back from the backend (:func:`inductor_json`), and entries stored before the
envelope existed (plain JSON) are read as they are.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import pickle
from collections.abc import Generator
from typing import Any

log = logging.getLogger("kcache.fx_graph_entries")

MAGIC = b"KCFXG1\n"
_HEADER_LEN = 4
_originals: dict[str, Any] = {}


def encode(inductor_json: bytes) -> bytes | None:
    """The envelope for one of Inductor's JSON entries; None if it is not the expected shape
    (then it is stored as it came, and read back the same way)."""
    try:
        entry = json.loads(inductor_json)
        if not isinstance(entry, dict) or not isinstance(entry.get("data"), str):
            return None
        payload = binascii.a2b_base64(entry.pop("data"), strict_mode=True)  # re-encodes to the same text
    except (ValueError, binascii.Error):
        return None
    header = json.dumps(entry, separators=(",", ":")).encode()
    return b"".join((MAGIC, len(header).to_bytes(_HEADER_LEN, "big"), header, payload))


def decode(stored: bytes) -> tuple[dict[str, Any], bytes] | None:
    """``(other fields, pickle)`` of an envelope; None for plain JSON. Raises ValueError if the
    envelope is damaged."""
    if not stored.startswith(MAGIC):
        return None
    start = len(MAGIC) + _HEADER_LEN
    size = int.from_bytes(stored[len(MAGIC) : start], "big")
    if len(stored) < start + size:
        raise ValueError("truncated FX-graph entry")
    header = json.loads(stored[start : start + size])
    if not isinstance(header, dict):
        raise ValueError("FX-graph entry header is not an object")
    return header, stored[start + size :]


def inductor_json(stored: bytes) -> bytes:
    """What Inductor's JSON serde expects, whichever form is stored."""
    decoded = decode(stored)
    if decoded is None:
        return stored
    header, payload = decoded
    return json.dumps({"data": base64.b64encode(payload).decode("ascii"), **header}).encode("ascii")


def pickled_graph(stored: bytes) -> bytes:
    """The pickle inside a stored entry, envelope or Inductor's JSON. Raises ValueError."""
    decoded = decode(stored)
    if decoded is not None:
        return decoded[1]
    entry = json.loads(stored)
    if not isinstance(entry, dict) or not isinstance(entry.get("data"), (str, bytes)):
        raise ValueError("not an FX-graph entry")
    return base64.b64decode(entry["data"])


def install_fast_reads(is_kcache_backend: Any) -> bool:
    """Wrap ``FxGraphCache.iterate_over_candidates``: when the remote cache is kcache's, read
    its entry as a raw pickle. False (nothing changed) where this torch lacks the method."""
    if _originals:
        return True
    from torch._inductor.codecache import FxGraphCache

    original = getattr(FxGraphCache, "iterate_over_candidates", None)
    if original is None:
        return False
    had_own = "iterate_over_candidates" in FxGraphCache.__dict__  # else inherited from GuardedCache

    def iterate_over_candidates(cls: Any, local: bool, remote_cache: Any, key: str) -> Generator[tuple[Any, bytes, bool], None, None]:
        backend: Any = getattr(remote_cache, "backend", None)
        if remote_cache is None or not is_kcache_backend(backend):
            yield from original.__func__(cls, local, remote_cache, key)
            return
        yield from original.__func__(cls, local, None, key)  # local candidates, as Inductor reads them
        # Inductor logs and skips a remote entry it cannot load; so do we.
        try:
            # RemoteCache.get formats the key (``pt2:fx-graph-v1::<key>:c1``) before its backend sees it.
            get_key = getattr(remote_cache, "_get_key", None)
            stored = backend.get_stored(get_key(key) if get_key is not None else key)
            _count_inductor_get(remote_cache, stored)
            if stored is None:
                return
            content = pickled_graph(stored)
            graph = pickle.loads(content)
        except Exception:
            log.warning("kcache: could not load FX-graph entry %s", key, exc_info=True)
            return
        yield graph, content, False

    _originals["iterate_over_candidates"] = FxGraphCache.__dict__["iterate_over_candidates"] if had_own else None
    FxGraphCache.iterate_over_candidates = classmethod(iterate_over_candidates)  # type: ignore[assignment, method-assign]
    return True


def _count_inductor_get(remote_cache: Any, stored: bytes | None) -> None:
    """Keep Inductor's own remote-cache counters (``TORCH_LOGS=cache``) as its get() would."""
    try:
        from torch._inductor.remote_cache import cache_stats

        cache_stats.get(type(remote_cache).__name__, stored)
    except Exception:
        pass


def uninstall_fast_reads() -> None:
    if not _originals:
        return
    from torch._inductor.codecache import FxGraphCache

    own = _originals.pop("iterate_over_candidates")
    if own is None:
        del FxGraphCache.iterate_over_candidates
    else:
        FxGraphCache.iterate_over_candidates = own  # type: ignore[method-assign]
