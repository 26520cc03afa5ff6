"""CacheStore: the one entry point from the routes to the cache's domain.

It opens nothing itself: it takes a blob store and an index (:mod:`kcache_server.storage`),
builds one object per concern over them, and hands each only the parts it uses. Routes reach
the concerns as ``store.<concern>`` (``store.kernels.put(...)``, ``store.runs.get(...)``); no
route touches the index, the blob store or the access recorder (tests/test_architecture.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kcache_schemas import PackLimits

from kcache_server.memory_budget import MemoryBudget
from kcache_server.retention_rules import RetentionConfig
from kcache_server.storage import BackendUnavailable, BlobStore, Index
from kcache_server.store.access_recorder import AccessRecorder
from kcache_server.store.blob_references import BlobReferences
from kcache_server.store.cache_entries import CacheEntries
from kcache_server.store.commit import CommitProtocol
from kcache_server.store.gc import Collector
from kcache_server.store.kernel_packs import KernelPacks
from kcache_server.store.key_part_purge import KeyPartPurge
from kcache_server.store.pins import Pins
from kcache_server.store.presigned_urls import PresignedUrls
from kcache_server.store.quarantine import Quarantine
from kcache_server.store.records import Records
from kcache_server.store.run_reports import RunReports
from kcache_server.store.storage_limits import StorageLimits
from kcache_server.store.unsound_keys import UnsoundKeys
from kcache_server.store.workload_manifests import WorkloadManifests


class CacheStore:
    """``limits`` bound what a pack may unpack to; ``budget`` is the replica's memory budget,
    from which pack verification and file views take their working memory (unlimited if None);
    ``retention`` the namespaces' storage limits and age rules (:mod:`kcache_server.retention_rules`);
    ``presign_reuse_s`` how long one signed URL of a blob is handed out again
    (:mod:`kcache_server.store.presigned_urls`); ``workload_view_ttl_s`` how long a workload's
    view is served from this process's memory (:mod:`kcache_server.store.workload_manifests`)."""

    def __init__(
        self, blobs: BlobStore, index: Index, limits: PackLimits, access_flush_s: float = 2.0,
        budget: MemoryBudget | None = None, retention: RetentionConfig | None = None,
        presign_reuse_s: int = 0, workload_view_ttl_s: float = 0.0,
    ) -> None:
        self.blobs, self.index, self.limits = blobs, index, limits
        self.budget = budget or MemoryBudget(0)
        self.access = AccessRecorder(index, access_flush_s)
        self.retention = retention or RetentionConfig()
        # Called with a namespace whose uploads met its soft or hard limit: wakes the GC.
        self.on_pressure: Callable[[str], None] = lambda namespace: None
        # The rules and the wake-up are read through the store when used: both may be set later.
        self.records = Records(index)
        self.storage_limits = StorageLimits(
            self.records, lambda namespace: self.retention.policy(namespace), lambda namespace: self.on_pressure(namespace),
        )
        self.references = BlobReferences(blobs, index, self.records, self.storage_limits)
        self.commits = CommitProtocol(blobs, index, self.references, self.storage_limits)
        self.quarantine = Quarantine(index, self.commits, self.references)
        self.presigned_urls = PresignedUrls(blobs, presign_reuse_s)
        self.kernels = KernelPacks(
            blobs, index, limits, self.budget, self.access, self.commits, self.references, self.quarantine, self.records,
            self.presigned_urls,
        )
        self.entries = CacheEntries(self.presigned_urls, index, self.access, self.commits, self.references, self.quarantine)
        self.workloads = WorkloadManifests(index, self.records, self.access, self.quarantine, workload_view_ttl_s)
        self.runs = RunReports(index, self.records)
        self.pins = Pins(index, self.records)
        self.unsound = UnsoundKeys(index, self.records)
        self.purge = KeyPartPurge(blobs, index, self.records, self.kernels, self.entries)
        self.gc = Collector(blobs, index, self.access, self.records, self.references, self.pins, lambda: self.retention)

    @property
    def presigns(self) -> bool:
        """The blob store can hand out presigned download URLs (an object store's)."""
        return bool(self.blobs.presigns)

    def readiness(self) -> dict[str, str]:
        """``"ok"`` or what is wrong, for each backend."""
        checks: dict[str, str] = {}
        for name, backend in (("blobs", self.blobs), ("index", self.index)):
            try:
                backend.ping()
                checks[name] = "ok"
            except BackendUnavailable as exc:
                checks[name] = str(exc)
            except Exception as exc:  # a backend bug must still read as "not ready", not a 500
                checks[name] = f"{type(exc).__name__}: {exc}"
        return checks

    def close(self) -> None:
        self.access.close()
        self.blobs.close()
        self.index.close()
