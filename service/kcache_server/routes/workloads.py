"""Workload manifests: ``/v1/{namespace}/workloads``.

Each published run is its own record (kind ``workload/<name>``, key ``<fingerprint id>/<content
hash>``), so concurrent publishers never overwrite each other; GET merges every run of one
environment. Identical publishes collapse into one record.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from kcache_schemas import ErrorCode, validate_workload_name, wire
from kcache_schemas.models import (
    EntryRef,
    EnvFingerprint,
    WorkloadManifest,
    WorkloadSummary,
    WorkloadView,
)

from kcache_server.deps import CanRead, CanWrite, Namespace, StoreDep
from kcache_server.errors import ApiError, not_found
from kcache_server.storage import IndexRecord

router = APIRouter(tags=["workloads"])
_PAGE = 1000


def _name(name: str) -> str:
    return validate_workload_name(name)


WorkloadName = Annotated[str, Depends(_name)]


def _kind(name: str) -> str:
    return f"workload/{name}"


def _runs(store: StoreDep, namespace: str, name: str) -> list[IndexRecord]:
    records, after = [], ""
    while page := store.index.list(namespace, _kind(name), after=after, limit=_PAGE):
        records += page
        after = page[-1].key
    return records


@router.put(wire.WORKLOAD, status_code=201, summary="Publish the kernels and entries one run used")
def put_workload(namespace: Namespace, name: WorkloadName, body: WorkloadManifest, store: StoreDep, _: CanWrite, response: Response) -> dict[str, str]:
    if body.name != name:
        raise ApiError(400, ErrorCode.INVALID_REQUEST, f"body names workload {body.name!r}, the URL {name!r}")
    canonical = json.dumps({"k": sorted(body.kernels), "e": sorted((e.layer, e.key) for e in body.entries)})
    key = f"{body.fingerprint.id}/{hashlib.sha256(canonical.encode()).hexdigest()[:32]}"
    record = IndexRecord(namespace=namespace, kind=_kind(name), key=key, digest="", size=len(canonical), meta=body.model_dump_json())
    stored = store.index.put_if_absent(record)
    response.status_code = 201 if stored.created_at == record.created_at else 200
    return {"fingerprint": body.fingerprint.id, "run": key}


@router.get(wire.WORKLOAD, response_model=WorkloadView, summary="The merged manifest for one environment")
def get_workload(
    namespace: Namespace, name: WorkloadName, store: StoreDep, _: CanRead,
    fingerprint: Annotated[str | None, Query(max_length=16, description="environment id; default: the newest run's")] = None,
) -> WorkloadView:
    records = _runs(store, namespace, name)
    if not records:
        raise not_found(f"workload {name}")
    runs = [WorkloadManifest.model_validate_json(r.meta) for r in records]
    fp_id = fingerprint or max(records, key=lambda r: r.created_at).key.split("/")[0]
    mine = [m for m in runs if m.fingerprint.id == fp_id]
    others = {m.fingerprint.id: m.fingerprint for m in runs if m.fingerprint.id != fp_id}
    if not mine:
        # Say which environments do exist: the client turns this into a miss reason.
        return WorkloadView(name=name, fingerprint=EnvFingerprint(), kernels=[], entries=[], runs=0, other_fingerprints=list(others.values()))
    kernels = sorted({k for m in mine for k in m.kernels})
    entries = sorted({(e.layer, e.key) for m in mine for e in m.entries})
    return WorkloadView(
        name=name, fingerprint=mine[0].fingerprint, kernels=kernels,
        entries=[EntryRef(layer=layer, key=key) for layer, key in entries], runs=len(mine),
        other_fingerprints=list(others.values()),
    )


@router.get(wire.WORKLOADS, response_model=list[WorkloadSummary], summary="Workloads in the namespace")
def list_workloads(namespace: Namespace, store: StoreDep, _: CanRead) -> list[WorkloadSummary]:
    kinds = [k for k in store.index.usage().get(namespace, {}) if k.startswith("workload/")]
    out = []
    for kind in sorted(kinds):
        name = kind.split("/", 1)[1]
        manifests = [WorkloadManifest.model_validate_json(r.meta) for r in _runs(store, namespace, name)]
        fps = {m.fingerprint.id: m.fingerprint for m in manifests}
        out.append(WorkloadSummary(name=name, runs=len(manifests), fingerprints=list(fps.values())))
    return out
