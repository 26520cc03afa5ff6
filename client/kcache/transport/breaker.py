"""A circuit breaker, so a dead service costs one timeout per window instead of one per call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """closed → (``failures`` consecutive failures) → open → (after ``reset_s``) half-open.

    While open, ``allow()`` is False and callers skip the network entirely. Half-open lets one
    probe through: success closes the breaker, failure re-opens it for another window.
    """

    def __init__(self, failures: int = 3, reset_s: float = 30.0, clock: Callable[[], float] | None = None) -> None:
        self._threshold = max(1, failures)
        self._reset_s = reset_s
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        self.times_opened = 0
        self.ever_succeeded = False  # has the service answered this process at all?

    @property
    def state(self) -> str:
        with self._lock:
            if self._opened_at is None:
                return "closed"
            return "half-open" if self._clock() - self._opened_at >= self._reset_s else "open"

    def allow(self) -> bool:
        with self._lock:
            if self._opened_at is None:
                return True
            if self._clock() - self._opened_at < self._reset_s or self._probing:
                return False
            self._probing = True  # exactly one probe at a time
            return True

    def success(self) -> None:
        with self._lock:
            self.ever_succeeded = True
            self._failures, self._opened_at, self._probing = 0, None, False

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._probing or self._failures >= self._threshold:
                if self._opened_at is None or self._probing:
                    self.times_opened += 1
                self._opened_at, self._probing = self._clock(), False
