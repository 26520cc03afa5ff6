"""Workload manifests: ``workloads`` (see :mod:`kcache_server.store.workload_manifests`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from kcache_schemas import validate_workload_name, wire
from kcache_schemas.models import WorkloadManifest, WorkloadSummary, WorkloadView

from kcache_server.deps import CanRead, CanWrite, Namespace, SettingsDep, StoreDep

router = APIRouter(tags=["workloads"])


async def _name(name: str) -> str:
    return validate_workload_name(name)


WorkloadName = Annotated[str, Depends(_name)]


@router.put(wire.WORKLOAD, status_code=201, summary="Publish the kernels and entries one run used",
            responses={200: {"description": "The same kernels and entries were published for this environment already: nothing changed"}})
def put_workload(namespace: Namespace, name: WorkloadName, body: WorkloadManifest, store: StoreDep, _: CanWrite, response: Response) -> dict[str, str]:
    fingerprint, run, created = store.workloads.publish(namespace, name, body)
    response.status_code = 201 if created else 200
    return {"fingerprint": fingerprint, "run": run}


@router.get(wire.WORKLOAD, response_model=WorkloadView, summary="The merged manifest for one environment",
            responses={200: {"headers": {wire.DOWNLOADS: {
                "description": "`presigned`: this service answers kernels:batch-urls and entry GETs with object-store URLs",
                "schema": {"type": "string", "enum": [wire.DOWNLOADS_PRESIGNED]}}}}})
def get_workload(
    namespace: Namespace, name: WorkloadName, store: StoreDep, settings: SettingsDep, _: CanRead, response: Response,
    fingerprint: Annotated[str | None, Query(max_length=16, description="environment id; default: the newest run's")] = None,
) -> WorkloadView:
    view = store.workloads.view(namespace, name, fingerprint)
    if settings.presigned_downloads and store.presigns:
        # The prefetch that reads this view then asks for URLs, and the bytes skip this tier.
        response.headers[wire.DOWNLOADS] = wire.DOWNLOADS_PRESIGNED
    return view


@router.get(wire.WORKLOADS, response_model=list[WorkloadSummary], summary="Workloads in the namespace")
def list_workloads(namespace: Namespace, store: StoreDep, _: CanRead) -> list[WorkloadSummary]:
    return store.workloads.summaries(namespace)
