"""A namespace's soft and hard storage limits, checked before each upload (bazel-remote's
``--max_size``: ``507`` when full).

Past the hard limit an upload is refused (:class:`~kcache_server.domain_errors.InsufficientStorage`);
past the soft limit it wakes the GC (``on_pressure``). The check reads usage at most
``_USAGE_TTL_S`` old (plus this process's own writes since), and fresh once the namespace is
close to its soft limit, where other replicas' writes matter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kcache_schemas.gc_models import RetentionPolicy
from kcache_schemas.units import format_bytes

from kcache_server.domain_errors import InsufficientStorage
from kcache_server.store.records import Records

_USAGE_TTL_S = 1.0


class StorageLimits:
    """``policy(namespace)``: the namespace's rules now; ``on_pressure(namespace)``: called when
    an upload meets its soft or hard limit. Both are asked per call, so rules and the GC's wake-up
    set after the store is built apply."""

    def __init__(self, records: Records, policy: Callable[[str], RetentionPolicy], on_pressure: Callable[[str], None]) -> None:
        self._records, self._policy, self._on_pressure = records, policy, on_pressure
        self._lock = threading.Lock()
        self._usage: tuple[float, dict[str, int]] | None = None  # (when read, cache bytes per namespace)

    def check(self, namespace: str, size: int) -> None:
        """Refuse (507) an upload that would take the namespace past its hard limit; wake the GC
        once it is past its soft limit. Free when the namespace has no limits."""
        policy = self._policy(namespace)
        soft, hard = policy.soft_limit_bytes, policy.hard_limit_bytes
        if soft is None and hard is None:
            return
        # Past the soft limit every upload reads usage afresh: the hard limit then holds across
        # replicas up to the uploads in flight, and below it a second-old figure is plenty.
        near = soft if soft is not None else float("inf")
        used = self._cached_bytes(namespace, fresh_above=near - size)
        if soft is not None and used + size > soft:
            self._on_pressure(namespace)
        if hard is not None and used + size > hard:
            raise InsufficientStorage(
                f"namespace {namespace!r} holds {format_bytes(used)} of its {format_bytes(hard)} hard limit; "
                f"this upload of {format_bytes(size)} would pass it. The GC is evicting least recently used "
                "items (nothing used within the minimum age); retry later, or raise the limit (KCACHE_RETENTION)"
            )

    def count(self, namespace: str, size: int) -> None:
        """A committed upload: our own writes count at once, other replicas' within _USAGE_TTL_S."""
        with self._lock:
            if self._usage is not None:
                self._usage[1][namespace] = self._usage[1].get(namespace, 0) + size

    def forget(self) -> None:
        """After an eviction: the next check reads usage afresh (budgets see the space at once)."""
        with self._lock:
            self._usage = None

    def _cached_bytes(self, namespace: str, fresh_above: float) -> int:
        """The namespace's cache bytes, at most _USAGE_TTL_S old, or read now if the cached value
        is above ``fresh_above`` (close to a limit, other replicas' writes matter)."""
        with self._lock:
            cached = self._usage
            if cached is None or time.monotonic() - cached[0] > _USAGE_TTL_S or cached[1].get(namespace, 0) > fresh_above:
                cached = self._usage = (time.monotonic(), self._records.cache_bytes())
            return cached[1].get(namespace, 0)
