"""Workloads: the kernels and entries a job used, published at its exit, prefetched by the next.

Each published run is its own record (kind ``workload/<name>``, key ``<fingerprint id>/<content
hash>``), so concurrent publishers never overwrite each other; a view merges every run of one
environment. Identical publishes collapse into one record.

Every rank of every node of a fleet start reads the same view within moments (8 reads per node
start, two thirds of its index commands, measured in docs/scale.md), so a process serves a view
from memory for ``view_ttl_s``: a publish or quarantine through this process is seen at once,
one through another replica within ``view_ttl_s``. A stale view costs a node nothing it could
not meet anyway: a kernel it lists that is gone or quarantined is refused when asked for, and a
run published since is prefetched by the next start.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from kcache_schemas.models import (
    EntryRef,
    EnvFingerprint,
    WorkloadManifest,
    WorkloadSummary,
    WorkloadView,
)

from kcache_server.domain_errors import InvalidRequest, NotFound
from kcache_server.kinds import WORKLOAD, workload_kind
from kcache_server.storage import Index, IndexRecord
from kcache_server.store.access_recorder import AccessRecorder
from kcache_server.store.quarantine import Quarantine
from kcache_server.store.records import Records

# Views one process keeps (least recently read dropped first): a fleet start reads a handful.
MAX_CACHED_VIEWS = 64
# How long a request waits for another that reads the same view (index calls have their own,
# shorter deadlines; past this it reads the view itself).
LEADER_WAIT_S = 30.0


class WorkloadManifests:
    """``view_ttl_s`` 0: every view is read from the index. ``clock``: monotonic seconds."""

    def __init__(
        self, index: Index, records: Records, access: AccessRecorder, quarantine: Quarantine,
        view_ttl_s: float = 0.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._index, self._records, self._access, self._quarantine = index, records, access, quarantine
        self._view_ttl_s, self._clock = view_ttl_s, clock
        # (namespace, name, fingerprint asked for) -> (read at, generation read at, view); the
        # generation counts this process's publishes and quarantines: a view read before one is stale.
        self._views: OrderedDict[tuple[str, str, str | None], tuple[float, tuple[int, int], WorkloadView]] = OrderedDict()
        self._views_lock = threading.Lock()
        self._reading: dict[tuple[str, str, str | None], threading.Event] = {}
        self._publishes = 0

    def publish(self, namespace: str, name: str, manifest: WorkloadManifest) -> tuple[str, str, bool]:
        """Record one run's manifest; ``(fingerprint id, run key, whether it is new)``."""
        if manifest.name != name:
            raise InvalidRequest(f"body names workload {manifest.name!r}, the URL {name!r}")
        canonical = json.dumps({"k": sorted(manifest.kernels), "e": sorted((e.layer, e.key) for e in manifest.entries)})
        key = f"{manifest.fingerprint.id}/{hashlib.sha256(canonical.encode()).hexdigest()[:32]}"
        record = IndexRecord(namespace=namespace, kind=workload_kind(name), key=key, digest="", size=len(canonical), meta=manifest.model_dump_json())
        stored = self._index.put_if_absent(record)
        created = stored.created_at == record.created_at
        if created:
            with self._views_lock:
                self._publishes += 1
        else:
            # A run that used the same set again: its environment is still in use (what the GC's
            # environment purge asks), so count it as an access of the run record.
            self._access.record(namespace, record.kind, [key])
        return manifest.fingerprint.id, key, created

    def view(self, namespace: str, name: str, fingerprint: str | None = None) -> WorkloadView:
        """The merged manifest of one environment's runs (default: the newest run's environment).
        With no run in that environment, the view is empty and names the environments there are:
        the client turns that into a miss reason."""
        if self._view_ttl_s <= 0:
            return self._read_view(namespace, name, fingerprint)
        key = (namespace, name, fingerprint)
        now, generation = self._clock(), (self._publishes, self._quarantine.generation)
        with self._views_lock:
            view = self._fresh_view(key, now, generation)
            if view is not None:
                return view
            # A node's ranks ask at the same instant: one request reads, the others wait for it.
            reading = self._reading.get(key)
            leader = reading is None
            if reading is None:
                reading = self._reading[key] = threading.Event()
        if not leader:
            reading.wait(LEADER_WAIT_S)
            with self._views_lock:
                view = self._fresh_view(key, now, generation)
            # The reader failed (NotFound is not kept: a publish may follow) or took too long.
            return view if view is not None else self._read_view(namespace, name, fingerprint)
        try:
            view = self._read_view(namespace, name, fingerprint)
            with self._views_lock:
                self._views[key] = (now, generation, view)
                self._views.move_to_end(key)
                while len(self._views) > MAX_CACHED_VIEWS:
                    self._views.popitem(last=False)
            return view
        finally:
            with self._views_lock:
                del self._reading[key]
            reading.set()

    def _fresh_view(self, key: tuple[str, str, str | None], now: float, generation: tuple[int, int]) -> WorkloadView | None:
        """The view kept for ``key`` if it is younger than the TTL and no publish or quarantine
        of this process came after it (the caller holds the lock)."""
        held = self._views.get(key)
        if held is None or now - held[0] >= self._view_ttl_s or held[1] != generation:
            return None
        self._views.move_to_end(key)
        return held[2]

    def _read_view(self, namespace: str, name: str, fingerprint: str | None) -> WorkloadView:
        records = self._records.all_records(namespace, workload_kind(name))
        if not records:
            raise NotFound(f"workload {name}")
        runs = [WorkloadManifest.model_validate_json(r.meta) for r in records]
        fp_id = fingerprint or max(records, key=lambda r: r.created_at).key.split("/")[0]
        mine = [m for m in runs if m.fingerprint.id == fp_id]
        others = {m.fingerprint.id: m.fingerprint for m in runs if m.fingerprint.id != fp_id}
        if not mine:
            return WorkloadView(name=name, fingerprint=EnvFingerprint(), kernels=[], entries=[], runs=0, other_fingerprints=list(others.values()))
        kernels = sorted({k for m in mine for k in m.kernels})
        entries = sorted({(e.layer, e.key) for m in mine for e in m.entries})
        # A quarantined entry is never prefetched: no node downloads what torch could not load.
        by_layer: dict[str, list[str]] = {}
        for layer, key in entries:
            by_layer.setdefault(layer, []).append(key)
        out = {(layer, key) for layer, keys in by_layer.items() for key in self._quarantine.quarantined_keys(namespace, layer, keys)}
        entries = [e for e in entries if e not in out]
        return WorkloadView(
            name=name, fingerprint=mine[0].fingerprint, kernels=kernels,
            entries=[EntryRef(layer=layer, key=key) for layer, key in entries], runs=len(mine),
            other_fingerprints=list(others.values()),
        )

    def summaries(self, namespace: str) -> list[WorkloadSummary]:
        """Every workload of the namespace with its runs' environments."""
        prefix = WORKLOAD + "/"
        out = []
        for kind in sorted(k for k in self._records.kinds(namespace) if k.startswith(prefix)):
            name = kind[len(prefix):]
            manifests = [WorkloadManifest.model_validate_json(r.meta) for r in self._records.all_records(namespace, kind)]
            fps = {m.fingerprint.id: m.fingerprint for m in manifests}
            out.append(WorkloadSummary(name=name, runs=len(manifests), fingerprints=list(fps.values())))
        return out
