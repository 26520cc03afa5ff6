"""Optional HMAC signing of opaque cache entries (Turborepo's ``x-artifact-tag`` idea).

FX-graph entries carry pickles, and unpickling runs code. With ``KCACHE_SIGNING_KEY`` set,
producers wrap each entry as ``KCSIG1 | hmac-sha256(layer, key, data) | data`` and consumers
refuse (as a miss, counted as an error) anything unsigned or signed with another key — before
Inductor ever sees it. The service stays opaque: it stores the envelope like any bytes.
"""

from __future__ import annotations

import hashlib
import hmac

MAGIC = b"KCSIG1"
_MAC_LEN = 32


class BadSignature(ValueError):
    pass


def _mac(secret: bytes, layer: str, key: str, data: bytes) -> bytes:
    h = hmac.new(secret, digestmod=hashlib.sha256)
    h.update(f"{layer}\0{key}\0".encode())
    h.update(data)
    return h.digest()


def sign(secret: bytes, layer: str, key: str, data: bytes) -> bytes:
    return MAGIC + _mac(secret, layer, key, data) + data


def verify(secret: bytes, layer: str, key: str, envelope: bytes) -> bytes:
    if not envelope.startswith(MAGIC) or len(envelope) < len(MAGIC) + _MAC_LEN:
        raise BadSignature("entry is not signed")
    mac = envelope[len(MAGIC) : len(MAGIC) + _MAC_LEN]
    data = envelope[len(MAGIC) + _MAC_LEN :]
    if not hmac.compare_digest(mac, _mac(secret, layer, key, data)):
        raise BadSignature("entry signature does not verify")
    return data
