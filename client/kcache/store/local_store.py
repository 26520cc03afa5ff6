"""The client's local tier for opaque cache entries and prefetched kernel packs
(``$KCACHE_LOCAL_DIR``, default ``~/.cache/kcache/client``): filled by prefetch, ``kcache warm`` and
remote hits, read before the network, so a warmed node needs no network at all.

Layout: ``<root>/entries/<service id>/<namespace>/<layer>/<d[:2]>/<digest>``. The service id is a
hash of the service URL: a node that talks to two services (staging and production, say) never
serves one's entries for the other's keys.

Bounded by ``KCACHE_LOCAL_MAX_BYTES`` across everything under ``<root>/entries``, least recently
used first: a read marks a file used (its mtime), and a process that has written more than a slice
of the budget since it last looked scans the tier and evicts the oldest files down to 90 % of the
budget. Several processes of a node share the tier: writes are atomic renames, a reader that loses
a file to another process's eviction sees a miss, and one process evicts at a time (a
non-blocking ``flock``; correctness never depends on it, it only avoids duplicated scans).

**One download per node.** Processes of a node that start independently share nothing but this
tier, so it also holds their locks (:mod:`kcache.host.node_lock`), under ``<root>/locks/<service
id>/<namespace>/`` (outside the LRU budget): a per-key lock that a process holds while it fetches
an entry or pack the tier lacks (the others wait for it, bounded, then find it here), and a claim
per workload that the process prefetching it holds (:meth:`LocalEntryStore.prefetch_claim`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kcache.host.node_lock import NodeLock

if TYPE_CHECKING:
    from kcache.config import ClientConfig

ENTRIES_DIR = "entries"
LOCKS_DIR = "locks"
_LOCK_FILE = ".evict.lock"
# A lock file this old has no holder left (a fetch is bounded by seconds): the eviction pass
# removes it, so lock files do not pile up with every key ever fetched.
_STALE_LOCK_S = 24 * 3600
_LOW_WATER = 0.9  # evict down to this share of the budget, so the next writes do not evict again
_RESCAN_SHARE = 0.1  # rescan after writing this share of the budget


def service_id(url: str | None) -> str:
    """A short, stable name for the service a cache entry came from."""
    canonical = (url or "").strip().rstrip("/").lower()
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class LocalEntryStore:
    def __init__(self, root: Path, namespace: str, *, url: str | None = None, max_bytes: int | None = None) -> None:
        self.tier = root / ENTRIES_DIR
        self.root = self.tier / service_id(url) / namespace
        self.locks = root / LOCKS_DIR / service_id(url) / namespace
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._written_since_scan: int | None = None  # None: never scanned by this process

    @classmethod
    def of(cls, config: ClientConfig) -> LocalEntryStore:
        """The local tier of this config's service and namespace, bounded as configured."""
        return cls(config.local_root(), config.namespace, url=config.url, max_bytes=config.local_max_bytes or None)

    def _path(self, layer: str, key: str, under: Path | None = None) -> Path:
        # Keys are hashed into the file name: they come from Inductor and may contain ':' etc.
        digest = hashlib.sha256(key.encode()).hexdigest()
        return (under or self.root) / layer / digest[:2] / digest

    def get(self, layer: str, key: str) -> bytes | None:
        path = self._path(layer, key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if self.max_bytes is not None:
            with contextlib.suppress(OSError):  # evicted meanwhile: the bytes we hold still serve
                os.utime(path)  # used now: the last to be evicted
        return data

    def has(self, layer: str, key: str) -> bool:
        return self._path(layer, key).is_file()

    def lock(self, layer: str, key: str, wait_s: float) -> NodeLock:
        """This node's lock on fetching ``key``: held while a process downloads what the tier
        lacks, waited for (up to ``wait_s``) by the others, who then look in the tier again."""
        return NodeLock.acquire(self._path(layer, key, under=self.locks), wait_s)

    def prefetch_claim(self, workload: str, fingerprint: str, wait_s: float = 0.0) -> NodeLock:
        """The claim on prefetching ``workload`` (for this environment) into this tier: one
        process of the node holds it while it prefetches; a process that finds it taken waits
        for the tier to fill instead of downloading the workload again."""
        name = hashlib.sha256(f"{workload}\0{fingerprint}".encode()).hexdigest()
        return NodeLock.acquire(self.locks / "prefetch" / name, wait_s)

    def put(self, layer: str, key: str, data: bytes) -> None:
        path = self._path(layer, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)  # readers see the whole entry or none
        except OSError:
            return  # a local tier that cannot be written is only a slower cache
        self._account(len(data))

    def _account(self, nbytes: int) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            due = self._written_since_scan is None or self._written_since_scan + nbytes >= self.max_bytes * _RESCAN_SHARE
            self._written_since_scan = 0 if due else (self._written_since_scan or 0) + nbytes
        if due:
            self.evict()

    def evict(self) -> int:
        """Delete least recently used files until the tier holds at most 90 % of the budget, if
        it holds more than the budget; returns the bytes freed (0 when another process is
        already evicting, or nothing is over)."""
        if self.max_bytes is None:
            return 0
        with NodeLock.acquire(self.tier / _LOCK_FILE, 0) as lock:
            if not lock.held:
                return 0
            _remove_stale_locks(self.tier.parent / LOCKS_DIR)
            files = sorted(_files(self.tier))
            total = sum(size for _mtime, size, _path in files)
            if total <= self.max_bytes:
                return 0
            target, freed = int(self.max_bytes * _LOW_WATER), 0
            for _mtime, size, path in files:  # oldest first
                if total - freed <= target:
                    break
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    freed += size
            return freed

    def discard(self, layer: str, key: str) -> None:
        with contextlib.suppress(OSError):  # gone already, or never written
            self._path(layer, key).unlink()

    def usage(self) -> int:
        """Bytes held by the whole tier (every service and namespace)."""
        return sum(size for _mtime, size, _path in _files(self.tier))


def tier_files(root: Path) -> Iterator[tuple[float, int, Path]]:
    """``(mtime, size, path)`` of every entry file of the local tier at ``root`` (every service
    and namespace), as the eviction pass sees them (``kcache local``)."""
    return _files(root / ENTRIES_DIR)


def _files(tier: Path) -> Iterator[tuple[float, int, Path]]:
    """``(mtime, size, path)`` of every entry file; temp files of writers still running are
    left out unless they are old (a writer that crashed)."""
    stale = time.time() - 3600
    for dirpath, _dirs, names in os.walk(tier):
        for name in names:
            if name == _LOCK_FILE:
                continue
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError:
                continue
            if name.startswith(".tmp-") and st.st_mtime > stale:
                continue
            yield st.st_mtime, st.st_size, path


def _remove_stale_locks(locks: Path) -> None:
    """Lock files untouched for a day, of keys nobody fetches now (free: taken without waiting)."""
    stale = time.time() - _STALE_LOCK_S
    for dirpath, _dirs, names in os.walk(locks):
        for name in names:
            path = Path(dirpath) / name
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < stale:
                    with NodeLock.acquire(path, 0) as lock:
                        if lock.held:
                            path.unlink()
