"""Blob store on a local directory (the embedded default): ``<root>/<d[:2]>/<digest>``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kcache_server.storage.base import BackendUnavailable, BlobNotFound, BlobStore


class FileBlobStore(BlobStore):
    name = "file"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        # Digests are validated sha256 hex before they get here; the check is a last guard
        # against ever building a path from anything else.
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
        return self.root / digest[:2] / digest

    def put(self, digest: str, data: bytes) -> None:
        path = self._path(digest)
        if path.exists() and path.stat().st_size == len(data):
            return  # content-addressed: same digest, same bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write to a temp file in the same dir, fsync, then rename: a reader sees the whole blob
        # or none, and a crash leaves only a temp file (never a truncated blob under its name).
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, digest: str) -> bytes:
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(digest) from None

    def size(self, digest: str) -> int | None:
        try:
            return self._path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def delete(self, digest: str) -> None:
        self._path(digest).unlink(missing_ok=True)

    def ping(self) -> None:
        if not os.access(self.root, os.W_OK):
            raise BackendUnavailable(self.name, f"{self.root} is not writable")
