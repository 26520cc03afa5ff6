"""Key soundness: ``unsound`` (what nodes' canaries reported, :mod:`kcache_server.store.unsound_keys`) and
``purge`` (delete entries by recorded key part, :mod:`kcache_server.store.key_part_purge`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from kcache_schemas import wire
from kcache_schemas.purge import PurgeReport, PurgeRequest
from kcache_schemas.unsound_reports import MAX_LISTED, UnsoundList, UnsoundReport

from kcache_server.deps import (
    CanAdmin,
    CanRead,
    CanWrite,
    EntryKey,
    Layer,
    Namespace,
    StoreDep,
    read_body,
)
from kcache_server.store import unsound_keys

router = APIRouter(tags=["key soundness"])


@router.put(wire.UNSOUND, status_code=201, response_model=UnsoundReport,
            summary="Report an unsound key: a node compiled it and got other output than the stored entry",
            responses={200: {"model": UnsoundReport, "description": "The key was reported already: the first report"}})
async def report_unsound(
    request: Request, response: Response, namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, _: CanWrite,
    x_kcache_producer: Annotated[str | None, Header(max_length=256)] = None,
) -> UnsoundReport:
    with store.budget.hold() as share:
        body = await read_body(request, unsound_keys.MAX_REPORT_BYTES, share)
    report = unsound_keys.parse(body, layer, key)
    kept, created = await run_in_threadpool(store.unsound.record, namespace, report, x_kcache_producer)
    response.status_code = 201 if created else 200
    return kept


@router.get(wire.UNSOUND, response_model=UnsoundReport, summary="What a node's canary found for this key")
def get_unsound(namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, _: CanRead) -> UnsoundReport:
    return store.unsound.get(namespace, layer, key)


@router.get(wire.UNSOUND_LIST, response_model=UnsoundList, summary="The namespace's unsound keys, newest first")
def list_unsound(
    namespace: Namespace, store: StoreDep, _: CanRead, limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 50,
) -> UnsoundList:
    return store.unsound.listing(namespace, limit)


@router.post(wire.PURGE, response_model=PurgeReport, summary="Delete entries by recorded key part (admin)")
def run_purge(namespace: Namespace, body: PurgeRequest, store: StoreDep, _: CanAdmin) -> PurgeReport:
    """Scans the namespace's recorded key parts; unless ``dry_run``, deletes every entry and
    kernel whose parts match all conditions. Answers what matched and what was deleted."""
    return store.purge.run(namespace, body)
