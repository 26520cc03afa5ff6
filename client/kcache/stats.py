"""Per-process cache statistics: hits, misses (with reasons) and errors per layer, bytes moved,
time spent in kcache, and compile time saved.

Errors are counted apart from misses everywhere: a service that is down must show up as errors,
not as a cold cache (bazel-remote #649, sccache #2820).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LayerStats:
    hits: int = 0
    misses: int = 0
    errors: int = 0
    puts: int = 0
    put_errors: int = 0
    skipped: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0
    saved_s: float = 0.0
    miss_reasons: Counter[str] = field(default_factory=Counter)
    error_kinds: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "puts": self.puts,
            "put_errors": self.put_errors,
            "skipped": self.skipped,
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "seconds": round(self.seconds, 6),
            "saved_s": round(self.saved_s, 6),
            "miss_reasons": dict(self.miss_reasons),
            "error_kinds": dict(self.error_kinds),
        }


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.layers: defaultdict[str, LayerStats] = defaultdict(LayerStats)
        self.started_at = time.time()

    def hit(self, layer: str, nbytes: int = 0, saved_s: float = 0.0) -> None:
        with self._lock:
            s = self.layers[layer]
            s.hits += 1
            s.bytes_down += nbytes
            s.saved_s += saved_s

    def miss(self, layer: str, reason: str = "not_found") -> None:
        with self._lock:
            s = self.layers[layer]
            s.misses += 1
            s.miss_reasons[reason] += 1

    def error(self, layer: str, kind: str) -> None:
        with self._lock:
            s = self.layers[layer]
            s.errors += 1
            s.error_kinds[kind] += 1

    def put(self, layer: str, nbytes: int) -> None:
        with self._lock:
            s = self.layers[layer]
            s.puts += 1
            s.bytes_up += nbytes

    def put_error(self, layer: str, kind: str) -> None:
        with self._lock:
            s = self.layers[layer]
            s.put_errors += 1
            s.error_kinds[kind] += 1

    def skipped(self, layer: str, reason: str) -> None:
        with self._lock:
            s = self.layers[layer]
            s.skipped += 1
            s.miss_reasons[reason] += 1

    @contextmanager
    def timed(self, layer: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.layers[layer].seconds += time.perf_counter() - t0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {name: s.as_dict() for name, s in sorted(self.layers.items())}
