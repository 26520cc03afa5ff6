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
import inspect
import json
import logging
import pickle
import re
from collections.abc import Generator
from typing import Any

from kcache import patching
from kcache.failopen import guard, warn_once

log = logging.getLogger("kcache.fx_graph_entries")

MAGIC = b"KCFXG1\n"
_HEADER_LEN = 4


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


def stored_form(inductor_json: bytes) -> bytes:
    """What kcache stores for one of Inductor's JSON entries: the envelope, or the JSON as it came
    where it is not the expected shape (read back the same way)."""
    return encode(inductor_json) or inductor_json


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


_TIME_TAKEN = re.compile(rb'"time_taken_ms":\s*(\d+(?:\.\d+)?)\s*}\s*$')


def recorded_compile_time_s(entry: bytes) -> float | None:
    """The compile time Inductor recorded in an FX-graph or AOTAutograd entry (``time_taken_ms``),
    from the envelope's header or the end of Inductor's JSON; None where it is not there. Read
    from the head or the tail only: entries run to hundreds of MB (max-autotune), and this runs on
    the compile thread."""
    if entry.startswith(MAGIC):
        try:
            header = decode(entry[: len(MAGIC) + _HEADER_LEN + int.from_bytes(entry[len(MAGIC) : len(MAGIC) + _HEADER_LEN], "big")])
        except ValueError:
            return None
        taken = header[0].get("time_taken_ms") if header is not None else None
        return float(taken) / 1000 if isinstance(taken, (int, float)) and not isinstance(taken, bool) and taken >= 0 else None
    match = _TIME_TAKEN.search(entry[-128:])
    return float(match.group(1)) / 1000 if match else None


def pickled_graph(stored: bytes) -> bytes:
    """The pickle inside a stored entry, envelope or Inductor's JSON. Raises ValueError."""
    decoded = decode(stored)
    if decoded is not None:
        return decoded[1]
    entry = json.loads(stored)
    if not isinstance(entry, dict) or not isinstance(entry.get("data"), (str, bytes)):
        raise ValueError("not an FX-graph entry")
    return base64.b64decode(entry["data"])


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
