"""Retention: ``gc`` (budget, usage and last run; run a GC) and ``pins`` (see
:mod:`kcache_server.store.gc`, :mod:`kcache_server.store.pins`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from kcache_schemas import validate_workload_name, wire
from kcache_schemas.gc_models import GcReport, GcRequest, GcStatus, Pin, PinList

from kcache_server.deps import CanAdmin, CanRead, Namespace, StoreDep

router = APIRouter(tags=["retention"])


async def _name(name: str) -> str:
    return validate_workload_name(name)


WorkloadName = Annotated[str, Depends(_name)]


@router.get(wire.GC, response_model=GcStatus, summary="The namespace's storage budget, usage, pins and last GC")
def gc_status(namespace: Namespace, store: StoreDep, _: CanRead) -> GcStatus:
    return store.gc.status(namespace)


@router.post(wire.GC, response_model=GcReport, summary="Run a GC now (admin): the namespace's rules, with overrides")
def run_gc(namespace: Namespace, body: GcRequest, store: StoreDep, _: CanAdmin) -> GcReport:
    """Scans, plans and, unless ``dry_run``, evicts; answers the plan and what was done. 409 while
    another GC runs (one at a time across replicas)."""
    return store.gc.run(namespace, body, trigger="api")


@router.get(wire.PINS, response_model=PinList, summary="Pinned workloads")
def list_pins(namespace: Namespace, store: StoreDep, _: CanRead) -> PinList:
    return store.pins.listing(namespace)


@router.put(wire.PIN, status_code=201, response_model=Pin, summary="Pin a workload: its kernels and entries are never evicted (admin)",
            responses={200: {"model": Pin, "description": "Pinned already: nothing changed"}})
def pin(
    namespace: Namespace, name: WorkloadName, store: StoreDep, _: CanAdmin, response: Response,
    ahead: Annotated[bool, Query(alias=wire.PIN_AHEAD, description="pin a workload no published run names yet (else 404)")] = False,
) -> Pin:
    stored, created = store.pins.pin(namespace, name, ahead=ahead)
    response.status_code = 201 if created else 200
    return stored


@router.delete(wire.PIN, status_code=204, summary="Unpin a workload (admin)")
def unpin(namespace: Namespace, name: WorkloadName, store: StoreDep, _: CanAdmin) -> Response:
    store.pins.unpin(namespace, name)
    return Response(status_code=204)
