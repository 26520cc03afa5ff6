"""How the ``fx-graph`` layer stores an entry: Inductor's pickle raw, in an envelope.

Inductor hands its remote FX-graph cache ``json.dumps({"data": base64(pickle), "time_taken_ms":
N})`` and reads it back through ``json.loads`` and ``base64.b64decode``. A max-autotune graph
carries every kernel of its TritonBundle: GPT-2 6L's pickle is 180 MB, its JSON 240 MB, and a warm
H100 node spent ~0.7 s decoding it (``a2b_base64`` alone 0.35 s) before unpickling — work a node
with a local cache never does.

So kcache stores the pickle raw in an envelope (``MAGIC``, the length of a JSON header holding the
entry's other fields, the header, the pickle): a quarter smaller on the wire and in storage.
:mod:`kcache.layers.inductor.fx_graph_reads` hands the pickle straight to Inductor; every other
reader gets Inductor's JSON back (:func:`inductor_json`), and entries stored before the envelope
existed (plain JSON) are read as they are. Pure bytes in, bytes out: the runtime reads the compile
time an entry recorded from here, below every layer.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

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
