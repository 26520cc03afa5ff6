"""The memory budget of one replica (one worker process) for heavy requests.

A request that can hold a lot of memory takes its bytes from the budget before it holds them:
request bodies as their bytes arrive, and the decompression working set of a pack it verifies
or opens (:func:`kcache_schemas.pack.pack_work_bytes`, plus the file a file view returns). When
the budget cannot give them, the request is refused with :class:`~kcache_server.domain_errors.Overloaded`
(503 with ``Retry-After``) instead of pushing the replica towards its memory limit; everything a
request took goes back when it ends. A request alone may always proceed, whatever it needs
(its own size limits bound it), so a budget smaller than one request never locks that request out.

A body's declared ``Content-Length`` is *not* taken up front: it only has to fit beside what
other requests hold at that moment (:meth:`Hold.admit`, so an upload that cannot fit is refused
before its body is sent). Taking it up front let a few connections that declare large bodies and
then trickle a byte every few seconds hold the whole budget for nothing until their body
deadline, and every upload and file view on the replica answered 503 meanwhile (issue #31). Now
a slow client holds what it sent, and for no longer than the body deadlines
(:mod:`kcache_server.bodies`) allow.

Ordinary reads (a pack or an entry served as stored) are not counted: they are streamed from
the blob store a chunk at a time (:mod:`kcache_server.responses`), and counting them would put a
lock on the hot path.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kcache_server.domain_errors import Overloaded

_MIB = 1 << 20


class MemoryBudget:
    """Bytes the replica's heavy requests may hold at once; ``capacity`` 0 means unlimited."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._used = 0
        self._holders = 0

    @property
    def used(self) -> int:
        return self._used

    @contextmanager
    def hold(self, within: Hold | None = None) -> Iterator[Hold]:
        """A request's share: take from it while working, all of it goes back on exit.
        ``within``: the share the request already holds (its body), to go on taking from."""
        if within is not None:
            yield within
            return
        share = Hold(self)
        with self._lock:
            self._holders += 1
        try:
            yield share
        finally:
            with self._lock:
                self._used -= share.taken
                self._holders -= 1

    def _take(self, share: Hold, n: int, what: str, *, keep: bool = True) -> None:
        with self._lock:
            alone = self._used == share.taken
            if self.capacity and self._used + n > self.capacity and not alone:
                raise Overloaded(
                    f"kcache is at its memory budget: {what} needs {n / _MIB:.1f} MiB, "
                    f"{self._used / _MIB:.1f} of {self.capacity / _MIB:.0f} MiB are held by "
                    f"{self._holders - 1} other request(s); retry shortly"
                )
            if keep:
                self._used += n
                share.taken += n


class Hold:
    """One request's share of the budget."""

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget
        self.taken = 0

    def take(self, n: int, what: str) -> None:
        """Take ``n`` more bytes, or raise :class:`Overloaded` and take none."""
        if n > 0:
            self._budget._take(self, n, what)

    def admit(self, n: int, what: str) -> None:
        """Raise :class:`Overloaded` unless ``n`` more bytes fit beside what is held now; takes
        nothing (a declared body size: its bytes are taken as they arrive)."""
        if n > 0:
            self._budget._take(self, n, what, keep=False)
