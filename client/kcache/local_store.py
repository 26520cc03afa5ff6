"""The client's local tier for opaque cache entries (``$KCACHE_LOCAL_DIR``, default
``~/.cache/kcache/client``): filled by prefetch and ``kcache warm``, read before the network, so a
warmed node needs no network at all. Kernels need no such tier: they live in Triton's own dirs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


class LocalEntryStore:
    def __init__(self, root: Path, namespace: str) -> None:
        self.root = root / "entries" / namespace

    def _path(self, layer: str, key: str) -> Path:
        # Keys are hashed into the file name: they come from Inductor and may contain ':' etc.
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.root / layer / digest[:2] / digest

    def get(self, layer: str, key: str) -> bytes | None:
        try:
            return self._path(layer, key).read_bytes()
        except OSError:
            return None

    def put(self, layer: str, key: str, data: bytes) -> None:
        path = self._path(layer, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)  # readers see the whole entry or none
        except OSError:
            pass  # a local tier that cannot be written is only a slower cache
