"""Run statistics and dashboard queries: ``/v1/{namespace}/runs``, ``/v1/{namespace}/stats/*``.

A *run* is what clients with the same ``KCACHE_RUN_ID`` did (a CI job, a training job across its
ranks). Each process POSTs its own counters at exit; each report is its own index record (kind
``run/<run_id>``, key ``<host>-<pid>-<report id>``), so concurrent ranks never overwrite each
other and a retried POST is stored once. Reads sum the reports. A small ``run`` record per run
(key ``run_id``) remembers when it was last reported to, for listing runs newest first.
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from kcache_schemas import ErrorCode, wire
from kcache_schemas.models import (
    KernelEntry,
    RunAggregate,
    RunList,
    RunStatsReport,
    RunSummary,
    hit_rate,
    sum_layer_counts,
    summarize_environments,
    validate_run_id,
)
from pydantic import ValidationError

from kcache_server.auth import Authenticator
from kcache_server.deps import CanRead, CanWrite, Namespace, StoreDep, get_auth, read_body
from kcache_server.errors import ApiError, not_found
from kcache_server.metrics import collapse_usage
from kcache_server.storage import Index, IndexRecord
from kcache_server.store import KERNEL, CacheStore

router = APIRouter(tags=["runs"])

RUN = "run"
_PAGE = 1000
_MAX_REPORT_BYTES = 1 << 20
# Top-kernel queries scan the namespace's kernel records; stop somewhere sane.
_TOP_SCAN_LIMIT = 200_000
_HOST_RE = re.compile(r"[^A-Za-z0-9_.-]+")


def _run_id(run_id: str) -> str:
    return str(validate_run_id(run_id))


RunId = Annotated[str, Depends(_run_id)]


def run_kind(run_id: str) -> str:
    return f"{RUN}/{run_id}"


def _all(index: Index, namespace: str, kind: str, limit: int | None = None) -> list[IndexRecord]:
    records: list[IndexRecord] = []
    after = ""
    while limit is None or len(records) < limit:
        page = index.list(namespace, kind, after=after, limit=_PAGE)
        if not page:
            break
        records += page
        after = page[-1].key
    return records


def aggregate(namespace: str, run_id: str, reports: list[RunStatsReport]) -> RunAggregate:
    layers = sum_layer_counts([r.layers for r in reports])
    workloads = sorted({r.workload for r in reports if r.workload})
    hits = sum(c.hits for c in layers.values())
    misses = sum(c.misses for c in layers.values())
    errors = sum(c.errors for c in layers.values())
    starts = [r.started_at for r in reports if r.started_at]
    ends = [r.ended_at for r in reports if r.ended_at]
    return RunAggregate(
        run_id=run_id,
        namespace=namespace,
        workload=workloads[0] if len(workloads) == 1 else None,
        workloads=workloads,
        processes=len(reports),
        started_at=min(starts) if starts else 0.0,
        ended_at=max(ends) if ends else 0.0,
        hits=hits,
        misses=misses,
        errors=errors,
        puts=sum(c.puts for c in layers.values()),
        bytes_down=sum(c.bytes_down for c in layers.values()),
        bytes_up=sum(c.bytes_up for c in layers.values()),
        seconds=round(sum(c.seconds for c in layers.values()), 6),
        saved_s=round(sum(c.saved_s for c in layers.values()), 6),
        hit_rate=hit_rate(hits, misses, errors),
        environments=summarize_environments([(r.environment, r.layers) for r in reports]),
        layers=layers,
    )


def load_run(index: Index, namespace: str, run_id: str) -> RunAggregate | None:
    reports = [RunStatsReport.model_validate_json(r.meta) for r in _all(index, namespace, run_kind(run_id))]
    return aggregate(namespace, run_id, reports) if reports else None


def _store_report(store: CacheStore, namespace: str, run_id: str, report: RunStatsReport) -> tuple[str, bool]:
    host = _HOST_RE.sub("_", report.host)[:64] or "host"
    key = f"{host}-{report.pid}-{report.report_id}"
    meta = report.model_dump_json()
    record = IndexRecord(namespace=namespace, kind=run_kind(run_id), key=key, digest="", size=len(meta), meta=meta)
    stored = store.index.put_if_absent(record)
    now = time.time()
    existing = store.index.get(namespace, RUN, run_id)
    first = now
    workloads: set[str] = set()
    if existing is not None:
        try:
            old = json.loads(existing.meta)
            first = float(old.get("first_at", existing.created_at))
            workloads = set(old.get("workloads", []))
        except (ValueError, TypeError):
            pass
    if report.workload:
        workloads.add(report.workload)
    # Read-modify-write of a small "last reported" marker: a lost race loses at most a workload
    # name in the listing filter, never counts (those live in the per-report records).
    summary = json.dumps({"run_id": run_id, "first_at": first, "updated_at": now, "workloads": sorted(workloads)})
    store.index.upsert(IndexRecord(namespace=namespace, kind=RUN, key=run_id, digest="", size=len(summary), meta=summary, created_at=now))
    return key, stored.created_at == record.created_at


@router.post(wire.RUN_STATS, status_code=201, summary="Report one process's cache statistics for a run")
async def post_run_stats(request: Request, response: Response, namespace: Namespace, run_id: RunId, store: StoreDep, _: CanWrite) -> dict[str, Any]:
    body = await read_body(request, _MAX_REPORT_BYTES)
    try:
        report = RunStatsReport.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid body"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ApiError(422, ErrorCode.INVALID_REQUEST, f"{where}: {first.get('msg')}") from None
    key, created = await run_in_threadpool(_store_report, store, namespace, run_id, report)
    response.status_code = 201 if created else 200
    return {"run_id": run_id, "report": key}


@router.get(wire.RUN, response_model=RunAggregate, summary="A run's statistics, summed over its processes")
def get_run(namespace: Namespace, run_id: RunId, store: StoreDep, _: CanRead) -> RunAggregate:
    run = load_run(store.index, namespace, run_id)
    if run is None:
        raise not_found(f"run {run_id}")
    return run


@router.get(wire.RUNS, response_model=RunList, summary="Recent runs, newest first, with hit rates")
def list_runs(
    namespace: Namespace, store: StoreDep, _: CanRead,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    workload: Annotated[str | None, Query(max_length=128)] = None,
) -> RunList:
    markers = _all(store.index, namespace, RUN)
    if workload:
        markers = [m for m in markers if workload in json.loads(m.meta).get("workloads", [])]
    markers.sort(key=lambda m: (m.created_at, m.key), reverse=True)
    items: list[RunSummary] = []
    for marker in markers[:limit]:
        run = load_run(store.index, namespace, marker.key)
        if run is not None:
            items.append(RunSummary.model_validate(run.model_dump(exclude={"layers"})))
    return RunList(items=items)


@router.get(wire.STATS_USAGE, summary="Entries and bytes stored in the namespace, per kind")
def usage(namespace: Namespace, store: StoreDep, _: CanRead) -> dict[str, Any]:
    kinds = collapse_usage(store.index.usage().get(namespace, {}))
    return {
        "namespace": namespace,
        "kinds": {k: {"entries": u.entries, "bytes": u.bytes} for k, u in kinds.items()},
        "total": {"entries": sum(u.entries for u in kinds.values()), "bytes": sum(u.bytes for u in kinds.values())},
    }


def _top_item(record: IndexRecord) -> dict[str, Any]:
    entry = KernelEntry.model_validate_json(record.meta)
    return {
        "key": entry.key,
        "kernel_name": entry.kernel_name,
        "target": f"{entry.target.device_type.value}:{entry.target.arch}",
        "triton_version": entry.triton_version,
        "total_size": entry.total_size,
        "pack_size": entry.pack_size,
        "files": len(entry.files),
        "hits": record.hits,
        "last_access": record.last_access or None,
        "created_at": entry.created_at.timestamp(),
    }


@router.get(wire.STATS_TOP, summary="Top kernels by stored size or by hits")
def top_kernels(
    namespace: Namespace, store: StoreDep, _: CanRead,
    by: Annotated[Literal["size", "hits"], Query()] = "size",
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
) -> dict[str, Any]:
    records = _all(store.index, namespace, KERNEL, limit=_TOP_SCAN_LIMIT)
    if by == "size":
        records.sort(key=lambda r: (r.size, r.key), reverse=True)
    else:
        records.sort(key=lambda r: (r.hits, r.last_access, r.key), reverse=True)
    return {"by": by, "scanned": len(records), "items": [_top_item(r) for r in records[:limit]]}


@router.get(wire.NAMESPACES, summary="Namespaces this token may read (for the dashboard)")
def namespaces(
    store: StoreDep, auth: Annotated[Authenticator, Depends(get_auth)],
    authorization: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    principal = auth.authenticate(authorization)
    names = set(store.index.usage()) | {n for n in principal.namespaces if n != "*"}
    return {"items": sorted(n for n in names if principal.allows(n, "read"))}
