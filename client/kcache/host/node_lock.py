"""Locks shared by the processes of one node: an exclusive ``flock`` on a file in kcache's local tier.

What they are for: that the processes of a node that start independently (SLURM ``srun``, one
container per rank, pods sharing a host path: no common parent to hand anything down) download
each pack or entry once, and the workload prefetch once (:mod:`kcache.store.local_store`). Correctness
never depends on them, as with the emitter's atomic rename: every write to the local tier is
atomic, and a process that cannot get a lock in time goes on without it (fail-open). A holder that
dies loses its lock with it (the kernel releases a ``flock`` when the last descriptor closes), so
a killed downloader costs the others a retry, never a hang.

Without ``fcntl`` (Windows) every lock is granted at once: the processes then behave as they did
before there were locks.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - no flock on this platform: every lock is granted
    fcntl = None  # type: ignore[assignment]

# Polling a contended lock: from this, doubling, up to the ceiling. A waiter notices a released
# lock within _POLL_MAX_S; ``flock`` has no timeout of its own.
_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.05


class NodeLock:
    """An exclusive lock of this process on ``path``, until :meth:`release` (or exit).

    ``held``: this process holds it, or there is no lock to take (no ``flock`` on the platform,
    a tier it cannot write): the caller goes on as if it were alone. Not held: another process
    holds it, for longer than the caller would wait."""

    def __init__(self, path: Path, fd: int | None, held: bool, waited: bool = False) -> None:
        self.path, self._fd, self.held = path, fd, held
        self.waited = waited  # another process held it when we asked

    @classmethod
    def acquire(cls, path: Path, wait_s: float) -> NodeLock:
        """Take the lock, waiting for another holder up to ``wait_s`` (0: do not wait)."""
        if fcntl is None:
            return cls(path, None, True)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return cls(path, None, True)
        deadline = time.monotonic() + wait_s
        pause, waited = _POLL_MIN_S, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass
            else:
                with contextlib.suppress(OSError):
                    os.utime(fd)  # in use: the tier's cleanup removes only lock files long unused
                return cls(path, fd, True, waited)
            waited = True
            now = time.monotonic()
            if now >= deadline:
                os.close(fd)
                return cls(path, None, False, waited)
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, _POLL_MAX_S)

    def release(self) -> None:
        """Give the lock back (closing the descriptor releases the flock); twice is harmless."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> NodeLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
