"""Unsound keys: what a node's key-soundness canary reported (:mod:`kcache_schemas.unsound_reports`).

One record per ``(layer, key)`` (kind ``unsound/<layer>``, no blob, never evicted, like the
quarantine markers it comes with): the first report stands, later ones for the same key answer
it. The record keeps both compiles' recorded key parts, context and environments side by side,
so the key's missing factor can be found after the entry itself is gone.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from kcache_schemas.unsound_reports import MAX_LISTED, UnsoundList, UnsoundReport
from pydantic import ValidationError

from kcache_server.domain_errors import InvalidBody, NotFound
from kcache_server.storage import Index, IndexRecord
from kcache_server.store.records import Records

PREFIX = "unsound/"
MAX_REPORT_BYTES = 4 << 20  # two compiles' key parts and context, a bounded diff


def kind(layer: str) -> str:
    return f"{PREFIX}{layer}"


def parse(body: bytes, layer: str, key: str) -> UnsoundReport:
    """A report as sent, for the ``layer``/``key`` of its URL (what the body says of them is
    replaced); :class:`InvalidBody` naming the field if it is not one."""
    try:
        json.loads(body)  # not JSON at all: said so, before the schema's complaints
        report = UnsoundReport.model_validate_json(body, strict=True)  # "reported_at": 0 is no time
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid body"}
        raise InvalidBody(f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg')}") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidBody(f"not a JSON document: {str(exc)[:200]}") from None
    return report.model_copy(update={"layer": layer, "key": key})


class UnsoundKeys:
    def __init__(self, index: Index, records: Records) -> None:
        self._index, self._records = index, records

    def record(self, namespace: str, report: UnsoundReport, reporter: str | None) -> tuple[UnsoundReport, bool]:
        """Keep a report (the first per key stands); ``(the report kept, whether this one is it)``."""
        stamped = report.model_copy(update={"reporter": reporter, "reported_at": datetime.now(timezone.utc)})
        marker = IndexRecord(namespace=namespace, kind=kind(report.layer), key=report.key, digest="", size=0, meta=stamped.model_dump_json())
        stored = self._index.put_if_absent(marker)
        return UnsoundReport.model_validate_json(stored.meta), stored.created_at == marker.created_at

    def get(self, namespace: str, layer: str, key: str) -> UnsoundReport:
        found = self._index.get(namespace, kind(layer), key)
        if found is None:
            raise NotFound(f"unsound report of {layer} {key}")
        return UnsoundReport.model_validate_json(found.meta)

    def listing(self, namespace: str, limit: int = MAX_LISTED) -> UnsoundList:
        """The namespace's unsound reports, newest first (at most ``limit``)."""
        kinds = [k for k in self._records.kinds(namespace) if k.startswith(PREFIX)]
        reports: list[UnsoundReport] = []
        for k in kinds:
            for r in self._records.iter_records(namespace, k):
                try:
                    reports.append(UnsoundReport.model_validate_json(r.meta))
                except (ValidationError, json.JSONDecodeError):
                    continue  # written by a newer service in another shape: not ours to show
        reports.sort(key=lambda r: r.reported_at or datetime.min.replace(tzinfo=timezone.utc), reverse=True)
        return UnsoundList(items=reports[:limit], more=len(reports) > limit)
