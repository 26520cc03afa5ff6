"""Blob store on a local directory (the embedded default): ``<root>/<d[:2]>/<digest>``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kcache_server.storage.base import (
    READ_CHUNK,
    BackendUnavailable,
    BlobInfo,
    BlobNotFound,
    BlobStore,
    BlobStream,
)

_TMP_PREFIX = ".tmp-"
_HEX = frozenset("0123456789abcdef")


def _is_digest(name: str) -> bool:
    return len(name) == 64 and _HEX.issuperset(name)


class FileBlobStore(BlobStore):
    name = "file"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        # Digests are validated sha256 hex before they get here; the check is a last guard
        # against ever building a path from anything else.
        if not _is_digest(digest):
            raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
        return self.root / digest[:2] / digest

    def put(self, digest: str, data: bytes) -> None:
        path = self._path(digest)
        if path.exists() and path.stat().st_size == len(data):
            return  # content-addressed: same digest, same bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write to a temp file in the same dir, fsync, then rename: a reader sees the whole blob
        # or none, and a crash leaves only a temp file (never a truncated blob under its name).
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX)
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

    def open(self, digest: str, chunk_size: int = READ_CHUNK) -> BlobStream:
        try:
            fh = self._path(digest).open("rb", buffering=0)
        except FileNotFoundError:
            raise BlobNotFound(digest) from None
        try:
            size = os.fstat(fh.fileno()).st_size
        except BaseException:
            fh.close()
            raise
        # The open file is the blob (blobs are renamed into place, never rewritten), so a GC
        # that unlinks it meanwhile does not cut this read short.

        def chunks() -> Iterator[bytes]:
            try:
                while chunk := fh.read(chunk_size):
                    yield chunk
            except OSError as exc:
                raise BackendUnavailable(self.name, f"reading blob {digest[:16]}…: {exc}") from exc
            finally:
                fh.close()

        return BlobStream(size, chunks(), fh.close)

    def size(self, digest: str) -> int | None:
        try:
            return self._path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def delete(self, digest: str) -> None:
        self._path(digest).unlink(missing_ok=True)

    def _shards(self) -> Iterator[os.DirEntry[str]]:
        with os.scandir(self.root) as top:
            for shard in top:
                if len(shard.name) == 2 and shard.is_dir(follow_symlinks=False):
                    yield shard

    def scan(self) -> Iterator[BlobInfo]:
        for shard in self._shards():
            with os.scandir(shard.path) as entries:
                for e in entries:
                    if not _is_digest(e.name):
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:  # deleted while we looked
                        continue
                    yield BlobInfo(e.name, st.st_size, st.st_mtime)

    def remove_partial(self, older_than: float) -> int:
        removed = 0
        for shard in self._shards():
            with os.scandir(shard.path) as entries:
                for e in entries:
                    if e.name.startswith(_TMP_PREFIX):
                        try:
                            if e.stat(follow_symlinks=False).st_mtime < older_than:
                                os.unlink(e.path)
                                removed += 1
                        except FileNotFoundError:
                            pass
        return removed

    def ping(self) -> None:
        if not os.access(self.root, os.W_OK):
            raise BackendUnavailable(self.name, f"{self.root} is not writable")
