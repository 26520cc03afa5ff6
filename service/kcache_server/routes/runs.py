"""Run statistics and dashboard queries: ``runs``, ``stats/*``, ``namespaces`` (see
:mod:`kcache_server.store.run_reports` for what a run is)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from kcache_schemas import validate_run_id, wire
from kcache_schemas.stats_document import RunAggregate, RunList

from kcache_server.auth import Authenticator
from kcache_server.deps import CanRead, CanWrite, Namespace, StoreDep, get_auth, read_body
from kcache_server.store.run_reports import parse_report

router = APIRouter(tags=["runs"])

_MAX_REPORT_BYTES = 1 << 20


async def _run_id(run_id: str) -> str:
    return validate_run_id(run_id)


RunId = Annotated[str, Depends(_run_id)]


@router.post(wire.RUN_STATS, status_code=201, summary="Report one process's cache statistics for a run",
             responses={200: {"description": "This report (its report_id) was recorded already: nothing changed"}})
async def post_run_stats(request: Request, response: Response, namespace: Namespace, run_id: RunId, store: StoreDep, _: CanWrite) -> dict[str, Any]:
    with store.budget.hold() as share:
        body = await read_body(request, _MAX_REPORT_BYTES, share)
    report = parse_report(body)
    key, created = await run_in_threadpool(store.runs.record, namespace, run_id, report)
    response.status_code = 201 if created else 200
    return {"run_id": run_id, "report": key}


@router.get(wire.RUN, response_model=RunAggregate, summary="A run's statistics, summed over its processes")
def get_run(namespace: Namespace, run_id: RunId, store: StoreDep, _: CanRead) -> RunAggregate:
    return store.runs.get(namespace, run_id)


@router.get(wire.RUNS, response_model=RunList, summary="Recent runs, newest first, with hit rates")
def list_runs(
    namespace: Namespace, store: StoreDep, _: CanRead,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    workload: Annotated[str | None, Query(max_length=128)] = None,
) -> RunList:
    return store.runs.listing(namespace, limit, workload)


@router.get(wire.STATS_USAGE, summary="Entries and bytes stored in the namespace, per kind")
def usage(namespace: Namespace, store: StoreDep, _: CanRead) -> dict[str, Any]:
    kinds = store.records.usage().get(namespace, {})
    return {
        "namespace": namespace,
        "kinds": {k: {"entries": u.entries, "bytes": u.bytes} for k, u in kinds.items()},
        "total": {"entries": sum(u.entries for u in kinds.values()), "bytes": sum(u.bytes for u in kinds.values())},
    }


@router.get(wire.STATS_TOP, summary="Top kernels by stored size or by hits")
def top_kernels(
    namespace: Namespace, store: StoreDep, _: CanRead,
    by: Annotated[Literal["size", "hits"], Query()] = "size",
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
) -> dict[str, Any]:
    scanned, top = store.kernels.top(namespace, by, limit)
    items = [
        {
            "key": t.entry.key,
            "kernel_name": t.entry.kernel_name,
            "target": f"{t.entry.target.device_type.value}:{t.entry.target.arch}",
            "triton_version": t.entry.triton_version,
            "total_size": t.entry.total_size,
            "pack_size": t.entry.pack_size,
            "files": len(t.entry.files),
            "hits": t.hits,
            "last_access": t.last_access,
            "created_at": t.entry.created_at.timestamp(),
        }
        for t in top
    ]
    return {"by": by, "scanned": scanned, "items": items}


@router.get(wire.NAMESPACES, summary="Namespaces this token may read (for the dashboard)")
def namespaces(
    store: StoreDep, auth: Annotated[Authenticator, Depends(get_auth)],
    authorization: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    principal = auth.authenticate(authorization)
    names = store.records.namespaces() | {n for n in principal.namespaces if n != "*"}
    return {"items": sorted(n for n in names if principal.allows(n, "read"))}
