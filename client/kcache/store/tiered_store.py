"""The one read path of every cache layer: the node's local tier, then the workload's prefetch
(an item its manifest promises that is still downloading), then the service, then the local tier
back-filled with what the service sent, so the node's other processes and its next job read it
locally (sccache's ``MultiLevelStorage``: ordered tiers, back-fill, counts per tier).

Every read says which tier served it (``wire.ServedBy``), so the stats can say where hits come
from: ``local`` (the tier held it when asked: an earlier job, ``kcache warm``, another process of
the node), ``prefetch`` (this process's workload prefetch brought it, whether or not the compile
had to wait for it, or the compile waited for it while another process of the node prefetched)
and ``service`` (fetched on demand).

The store decides where bytes come from, never whether they are good: the caller's ``accept``
opens and checks a copy (signature, content) and refuses it by answering None. A refused copy of
the local tier is dropped and the service asked (its copy may be whole); a refused copy of the
service ends the read (the caller has counted it, and quarantined it if it must). Neither the
service nor the prefetch is known here (they are a floor above): the caller hands in how to ask
the service, and the prefetch as :class:`Promises`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kcache_schemas.wire import ServedBy

from kcache.host.node_lock import NodeLock
from kcache.store.local_store import LocalEntryStore

T = TypeVar("T")
# How to ask the service for an item: its stored bytes and the compile time its producer recorded
# (a header), or None on a miss or an error (the caller counts which).
ServiceRead = Callable[[], tuple[bytes, float | None] | None]
# The caller's check of a copy from a tier: the value to hand over, or None to refuse it.
Accept = Callable[[bytes, ServedBy], T | None]

LOCAL, PREFETCH, SERVICE = ServedBy.LOCAL, ServedBy.PREFETCH, ServedBy.SERVICE


class Promises(Protocol):
    """The workload's prefetch, as the read path sees it (:class:`kcache.transport.workload.Prefetcher`)."""

    def wait_for(self, layer: str, key: str) -> bool:
        """True if the manifest promises the item and it has now arrived (or failed)."""

    def brought(self, layer: str, key: str) -> bool:
        """True if this process's prefetch wrote the item into the local tier."""


@dataclass(frozen=True)
class Served(Generic[T]):
    """What a read found: the accepted ``value``, the ``tier`` that served it, the ``stored``
    bytes as the tier held them, and the compile time the service's answer recorded (None from
    the local tier or a prefetch: the caller reads it from the entry where it has one)."""

    value: T
    tier: ServedBy
    stored: bytes
    compile_time_s: float | None = None


class TieredStore:
    """Local tier -> promised prefetch -> service -> back-fill, for kernel packs and entries alike.

    ``wait_s``: how long a read waits for the node's lock on a key another process of the node is
    fetching (``KCACHE_PREFETCH_WAIT_S``); ``may_wait()`` says whether waiting for it is worth it
    (not while the service's breaker is not closed: a service that failed recently is not worth
    waiting for, and callers behind a half-open probe never wait)."""

    def __init__(self, local: LocalEntryStore, promises: Promises | None, wait_s: float, may_wait: Callable[[], bool]) -> None:
        self.local = local
        self.promises = promises
        self._wait_s = wait_s
        self._may_wait = may_wait

    def read(self, layer: str, key: str, service: ServiceRead | None, accept: Accept[T], *,
             backfill_in_background: bool = False) -> Served[T] | None:
        """The first tier's copy of ``(layer, key)`` that ``accept`` takes, or None. ``service``
        None: no service to ask (the tiers of this node only). A service copy is written into
        the local tier once accepted: in this thread, or with ``backfill_in_background`` off it
        (entries run to hundreds of MB), the node's lock on the key handed to that writer so
        the waiters look once the entry is there."""
        stored, tier = self._nearer(layer, key)
        lock: NodeLock | None = None
        if stored is None and service is not None:
            lock, stored = self._node_lock(layer, key)
        try:
            if stored is not None:
                value = accept(stored, tier)
                if value is not None:
                    return Served(value, tier, stored)
                self.local.discard(layer, key)  # refused: the service's copy may be whole
            if service is None:
                return None
            got = service()
            if got is None:
                return None
            stored, compile_time = got
            value = accept(stored, SERVICE)
            if value is None:
                return None
            keep, lock = lock, None
            if backfill_in_background:
                # Not a daemon: the interpreter lets the (atomic) write finish at exit.
                threading.Thread(target=self._backfill, args=(layer, key, stored, keep), name="kcache-local-put").start()
            else:
                self._backfill(layer, key, stored, keep)
            return Served(value, SERVICE, stored, compile_time)
        finally:
            if lock is not None:
                lock.release()

    def _nearer(self, layer: str, key: str) -> tuple[bytes | None, ServedBy]:
        """The local tier's copy; if the workload's manifest promises one still downloading, the
        copy once it arrived (waiting at most ``KCACHE_PREFETCH_WAIT_S``)."""
        promises = self.promises
        data = self.local.get(layer, key)
        if data is not None:
            return data, PREFETCH if promises is not None and promises.brought(layer, key) else LOCAL
        if promises is not None and promises.wait_for(layer, key) and (data := self.local.get(layer, key)) is not None:
            return data, PREFETCH
        return None, LOCAL

    def _node_lock(self, layer: str, key: str) -> tuple[NodeLock | None, bytes | None]:
        """Before going to the service for what the tiers lack: this node's lock on the key (one
        process of the node downloads it; the others wait for it, at most ``wait_s``), and the
        tier's copy if it arrived meanwhile (served by ``local``: another process fetched it).

        A lock that had to be waited for and brought nothing (the holder met a miss or an error)
        is let go at once: the waiters then ask the service side by side, not one after another."""
        if not self._may_wait():
            return None, None
        lock = self.local.lock(layer, key, self._wait_s)
        data = self.local.get(layer, key)
        if lock.waited and data is None:
            lock.release()
            return None, None
        return lock, data

    def _backfill(self, layer: str, key: str, data: bytes, lock: NodeLock | None) -> None:
        """Write a fetched item into the local tier, then let the node's waiters in."""
        try:
            self.local.put(layer, key, data)
        finally:
            if lock is not None:
                lock.release()
