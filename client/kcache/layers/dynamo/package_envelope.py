"""How the ``dynamo`` layer stores a package: torch's pickle with its producer's measurement.

A node deciding whether a Dynamo package paid (:mod:`kcache.layers.dynamo.payoff`) needs the compile
seconds the package replaced, measured where it was compiled. That number must reach the node
whichever way the package came (the service, a workload's prefetch, ``kcache warm``, the local
tier), so it travels inside the stored bytes: ``MAGIC``, the length of a JSON header, the header
(``compile_s``), then torch's pickle unchanged. The service stores it as opaque bytes (and the
same seconds as the entry's ``wire.COMPILE_TIME`` header, for ``kcache inspect``). Keys with this
format start ``pt2-precompile-v2:``; a plain pickle (no magic) is read as a package whose
producer measured nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

MAGIC = b"KCDYN1\n"
_HEADER_LEN = 4


@dataclass(frozen=True)
class StoredPackage:
    package: bytes  # torch's pickle (``DiskDynamoStore.write``)
    compile_s: float | None  # what compiling it took its producer; None: not measured


def encode(package: bytes, compile_s: float | None) -> bytes:
    header = json.dumps({"compile_s": round(compile_s, 4) if compile_s is not None else None}, separators=(",", ":")).encode()
    return b"".join((MAGIC, len(header).to_bytes(_HEADER_LEN, "big"), header, package))


def decode(stored: bytes) -> StoredPackage:
    """The package and its measurement. Raises ValueError if the envelope is damaged."""
    if not stored.startswith(MAGIC):
        return StoredPackage(stored, None)
    start = len(MAGIC) + _HEADER_LEN
    size = int.from_bytes(stored[len(MAGIC) : start], "big")
    if len(stored) < start + size:
        raise ValueError("truncated Dynamo package envelope")
    header = json.loads(stored[start : start + size])
    if not isinstance(header, dict):
        raise ValueError("Dynamo package header is not an object")
    compile_s = header.get("compile_s")
    if compile_s is not None and not (isinstance(compile_s, (int, float)) and not isinstance(compile_s, bool)
                                      and math.isfinite(compile_s) and compile_s >= 0):
        raise ValueError(f"Dynamo package header has a bad compile_s: {compile_s!r}")
    return StoredPackage(stored[start + size :], float(compile_s) if compile_s is not None else None)
