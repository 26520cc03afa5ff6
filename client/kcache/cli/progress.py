"""Dependency-free progress for long CLI operations, on stderr and only on a terminal (logs and
pipes get the one-line summary each command prints at the end).

:class:`Progress` counts items (and bytes) as they finish: ``push``, ``pull``, ``warm``.
:class:`Waiting` shows the seconds spent on one long request the service answers when done:
``gc`` of a large namespace on S3 takes minutes.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType

from kcache_schemas.units import format_bytes

_EVERY_S = 0.1


class Progress:
    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.nbytes = label, total, 0, 0
        self._tty = sys.stderr.isatty()
        self._last = 0.0
        self._lock = threading.Lock()  # warm's fetch threads advance it side by side
        self.started = time.perf_counter()

    def advance(self, nbytes: int = 0) -> None:
        with self._lock:
            self.done += 1
            self.nbytes += nbytes
            now = time.perf_counter()
            if self._tty and (now - self._last > _EVERY_S or self.done == self.total):
                self._last = now
                width = 30
                filled = int(width * self.done / max(1, self.total))
                size = f" {format_bytes(self.nbytes)}" if self.nbytes else ""
                sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}{size} {now - self.started:.0f}s ")
                sys.stderr.flush()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def close(self) -> None:
        if self._tty:
            sys.stderr.write("\n")


class Waiting:
    """``with Waiting("gc: the service is evicting"):`` shows the seconds so far, each second,
    until the block ends (a terminal only)."""

    def __init__(self, label: str, every_s: float = 1.0) -> None:
        self.label, self.every_s = label, every_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.perf_counter()

    def _show(self) -> None:
        while not self._done.wait(self.every_s):
            sys.stderr.write(f"\r{self.label}… {time.perf_counter() - self.started:.0f}s ")
            sys.stderr.flush()

    def __enter__(self) -> Waiting:
        if sys.stderr.isatty():
            self._thread = threading.Thread(target=self._show, name="kcache-waiting", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            sys.stderr.write("\r\033[K")  # the line cleared: the command's own output follows
            sys.stderr.flush()
