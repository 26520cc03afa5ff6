"""Runs: cache-hit statistics per CI job or training run, summed over its processes.

A *run* is what clients with the same run id did (a CI job, a training job across its ranks): their
``KCACHE_RUN_ID``, or the id they derived from their launcher (``kcache.host.launchers``), whose
variable each report names (``run_source``, shown with the run). Each process reports its own
counters at exit; each report is its own index record (kind ``run/<run_id>``, key
``<host>-<pid>-<report id>``), so concurrent ranks never overwrite each other and a retried report
is stored once. Reads sum the reports. A small ``run`` marker per run
(key ``run_id``) remembers when it was last reported to, for listing runs newest first.
"""

from __future__ import annotations

import json
import re
import time

from kcache_schemas.stats_document import RunAggregate, RunList, RunStatsReport, StatsDocument
from pydantic import ValidationError

from kcache_server.domain_errors import InvalidBody, NotFound
from kcache_server.kinds import RUN, run_kind
from kcache_server.storage import Index, IndexRecord
from kcache_server.store.records import Records

_HOST_RE = re.compile(r"[^A-Za-z0-9_.-]+")


def parse_report(body: bytes) -> RunStatsReport:
    """A process's report as its JSON schema reads it: ``true`` is no count and ``"3"`` no
    number (pydantic's lax mode took both), while ``3.0`` is an integer, as in JSON Schema.
    Unknown fields are still ignored: stats are lenient about what a newer client adds, not about
    the types of what both know. A body that fails is :class:`InvalidBody` naming the field."""
    try:
        tree = json.loads(body)
        return RunStatsReport.model_validate_json(json.dumps(_whole_numbers(tree)), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid body"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidBody(f"{where}: {first.get('msg')}") from None
    except (ValueError, RecursionError) as exc:  # not JSON (JSONDecodeError, UnicodeDecodeError), too deep
        raise InvalidBody(f"not a JSON document: {str(exc)[:200]}") from None


def _whole_numbers(value: object) -> object:
    """Floats without a fractional part as ints, through a parsed JSON document (a float field
    takes an int in strict mode; an int field does not take a float)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


class RunReports:
    def __init__(self, index: Index, records: Records) -> None:
        self._index, self._records = index, records

    def record(self, namespace: str, run_id: str, report: RunStatsReport) -> tuple[str, bool]:
        """Store one process's report; ``(its key, whether it is new)``."""
        host = _HOST_RE.sub("_", report.host)[:64] or "host"
        key = f"{host}-{report.pid}-{report.report_id}"
        meta = report.model_dump_json()
        record = IndexRecord(namespace=namespace, kind=run_kind(run_id), key=key, digest="", size=len(meta), meta=meta)
        stored = self._index.put_if_absent(record)
        now = time.time()
        existing = self._index.get(namespace, RUN, run_id)
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
        self._index.upsert(IndexRecord(namespace=namespace, kind=RUN, key=run_id, digest="", size=len(summary), meta=summary, created_at=now))
        return key, stored.created_at == record.created_at

    def _load(self, namespace: str, run_id: str) -> RunAggregate | None:
        reports = [RunStatsReport.model_validate_json(r.meta) for r in self._records.all_records(namespace, run_kind(run_id))]
        if not reports:
            return None
        return RunAggregate.of(namespace, run_id, StatsDocument.merge(r.document() for r in reports))

    def get(self, namespace: str, run_id: str) -> RunAggregate:
        run = self._load(namespace, run_id)
        if run is None:
            raise NotFound(f"run {run_id}")
        return run

    def listing(self, namespace: str, limit: int, workload: str | None = None) -> RunList:
        """Recent runs, newest first (optionally only those a workload took part in)."""
        markers = self._records.all_records(namespace, RUN)
        if workload:
            markers = [m for m in markers if workload in json.loads(m.meta).get("workloads", [])]
        markers.sort(key=lambda m: (m.created_at, m.key), reverse=True)
        runs = (self._load(namespace, m.key) for m in markers[:limit])
        return RunList(items=[run.summary() for run in runs if run is not None])
