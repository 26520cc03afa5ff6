"""Workloads: the kernels and entries a job used, published at its exit, prefetched by the next.

Each published run is its own record (kind ``workload/<name>``, key ``<fingerprint id>/<content
hash>``), so concurrent publishers never overwrite each other; a view merges every run of one
environment. Identical publishes collapse into one record.
"""

from __future__ import annotations

import hashlib
import json

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


class WorkloadManifests:
    def __init__(self, index: Index, records: Records, access: AccessRecorder, quarantine: Quarantine) -> None:
        self._index, self._records, self._access, self._quarantine = index, records, access, quarantine

    def publish(self, namespace: str, name: str, manifest: WorkloadManifest) -> tuple[str, str, bool]:
        """Record one run's manifest; ``(fingerprint id, run key, whether it is new)``."""
        if manifest.name != name:
            raise InvalidRequest(f"body names workload {manifest.name!r}, the URL {name!r}")
        canonical = json.dumps({"k": sorted(manifest.kernels), "e": sorted((e.layer, e.key) for e in manifest.entries)})
        key = f"{manifest.fingerprint.id}/{hashlib.sha256(canonical.encode()).hexdigest()[:32]}"
        record = IndexRecord(namespace=namespace, kind=workload_kind(name), key=key, digest="", size=len(canonical), meta=manifest.model_dump_json())
        stored = self._index.put_if_absent(record)
        created = stored.created_at == record.created_at
        if not created:
            # A run that used the same set again: its environment is still in use (what the GC's
            # environment purge asks), so count it as an access of the run record.
            self._access.record(namespace, record.kind, [key])
        return manifest.fingerprint.id, key, created

    def view(self, namespace: str, name: str, fingerprint: str | None = None) -> WorkloadView:
        """The merged manifest of one environment's runs (default: the newest run's environment).
        With no run in that environment, the view is empty and names the environments there are:
        the client turns that into a miss reason."""
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
