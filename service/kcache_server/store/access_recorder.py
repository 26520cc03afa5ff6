"""Hits counted in memory and flushed to the index in the background.

Last-access and hit counts feed the GC's eviction order and the dashboard; writing them on every
GET would put an index write on the hot read path, so they are batched (bazel-remote does the
same). Every read of :mod:`~kcache_server.store.kernel_packs` and
:mod:`~kcache_server.store.cache_entries` records here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from kcache_server.storage import BackendUnavailable, Index

log = logging.getLogger("kcache_server.store")


class AccessRecorder:
    """One per store: ``record`` is cheap (a counter under a lock), ``flush`` writes the counts."""

    def __init__(self, index: Index, interval_s: float) -> None:
        self._index, self._interval = index, interval_s
        self._pending: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kcache-access-flush", daemon=True)
        self._thread.start()

    def record(self, namespace: str, kind: str, keys: list[str]) -> None:
        with self._lock:
            for k in keys:
                self._pending[(namespace, kind, k)] += 1

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, Counter()
        groups: dict[tuple[str, str], list[str]] = {}
        for (ns, kind, key), n in pending.items():
            groups.setdefault((ns, kind), []).extend([key] * n)
        now = time.time()
        for (ns, kind), keys in groups.items():
            try:
                self._index.touch(ns, kind, keys, now)
            except BackendUnavailable:
                log.warning("could not record %d accesses: index unavailable", len(keys))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
