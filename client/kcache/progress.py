"""A dependency-free progress line for long CLI operations (stderr, only on a terminal)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.nbytes = label, total, 0, 0
        self._tty = sys.stderr.isatty()
        self._last = 0.0
        self.started = time.perf_counter()

    def advance(self, nbytes: int = 0) -> None:
        self.done += 1
        self.nbytes += nbytes
        now = time.perf_counter()
        if self._tty and (now - self._last > 0.1 or self.done == self.total):
            self._last = now
            width = 30
            filled = int(width * self.done / max(1, self.total))
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.nbytes / 1e6:.1f} MB")
            sys.stderr.flush()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def close(self) -> None:
        if self._tty:
            sys.stderr.write("\n")
