"""Opaque Inductor remote-cache entries: ``/v1/{namespace}/entries/{layer}/{key}``.

Bytes in, bytes out. The service never deserialises them (FX-graph entries carry pickles); in a
namespace with registered producer keys it checks their signature (:mod:`kcache_server.producer_keys`).
A client that hands torch an entry torch cannot load reports it (``.../quarantine``): the entry
then answers 404 ``quarantined`` to every node and its key takes no upload until an admin lifts it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse
from kcache_schemas import EntryInfo, Producer, QuarantineInfo, QuarantineRequest, wire
from kcache_schemas.models import EntryList, EntryUrls, EntryUrlsRequest

from kcache_server import downloads
from kcache_server.deps import (
    CanAdmin,
    CanRead,
    CanWrite,
    EntryKey,
    Layer,
    Namespace,
    SettingsDep,
    StoreDep,
    read_body,
)
from kcache_server.metrics import record_batch_lookups
from kcache_server.producer_keys import admit_entry, registered_keys, supersedes
from kcache_server.responses import blob_response

router = APIRouter(tags=["entries"])
# A cursor or prefix: the start of an entry key (its characters; may be empty).
ENTRY_KEY_PREFIX_PATTERN = r"^[A-Za-z0-9_.:=+-]*$"


def _headers(info: EntryInfo) -> dict[str, str]:
    headers = {"ETag": f'"{info.sha256}"', "Cache-Control": "public, max-age=31536000, immutable"}
    if info.producer.compile_time_s is not None:
        headers[wire.COMPILE_TIME] = f"{info.producer.compile_time_s:.3f}"
    return headers


@router.put(wire.ENTRY, status_code=201, response_model=EntryInfo, summary="Store an entry (write-once)",
            responses={200: {"model": EntryInfo, "description": "Identical content was stored already: nothing changed"}})
async def put_entry(
    request: Request, response: Response, namespace: Namespace, layer: Layer, key: EntryKey,
    store: StoreDep, settings: SettingsDep, _: CanWrite,
    x_kcache_compile_time: Annotated[float | None, Header(ge=0)] = None,
    x_kcache_producer: Annotated[str | None, Header(max_length=256)] = None,
) -> EntryInfo:
    producer = Producer(compile_time_s=x_kcache_compile_time, kcache_version=x_kcache_producer)
    keys = registered_keys(settings.registered_keys, namespace)
    with store.budget.hold() as share:
        body = await read_body(request, settings.max_entry_bytes, share)

        def put() -> tuple[EntryInfo, bool]:  # hashing and checking a signature: off the event loop
            signature = admit_entry(keys, layer, key, body)
            return store.entries.put(namespace, layer, key, body, producer, signature, supersedes(keys))

        info, created = await run_in_threadpool(put)
    response.status_code = 201 if created else 200
    return info


@router.get(wire.ENTRY, summary="Fetch an entry's bytes", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The entry's bytes, as stored"},
                       307: {"description": "presigned blob URL (presigned downloads on); the producer's compile time in " + wire.COMPILE_TIME}})
def get_entry(
    request: Request, namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, settings: SettingsDep, _: CanRead,
) -> Response:
    if settings.presigned_downloads:
        info, url = store.entries.download_url(namespace, layer, key, settings.presign_expires_s)
        if url is not None:
            downloads.record(settings, request, namespace, layer, key, "redirect", 0)
            # Only what the client credits (the compile time) rides on the redirect: the URL
            # expires, so nothing here may be cached as the entry's ETag or immutable bytes.
            return RedirectResponse(url, status_code=307, headers={k: v for k, v in _headers(info).items() if k == wire.COMPILE_TIME})
    info, blob = store.entries.open(namespace, layer, key)
    downloads.record(settings, request, namespace, layer, key, "get", blob.size)
    return blob_response(blob, "application/octet-stream", _headers(info))


@router.post(wire.ENTRIES_BATCH_URLS, response_model=EntryUrls, summary="Presigned object-store URLs for many entries")
def batch_entry_urls(request: Request, body: EntryUrlsRequest, namespace: Namespace, store: StoreDep, settings: SettingsDep,
                     _: CanRead) -> EntryUrls:
    """One index read per layer and a signature per stored entry: a prefetch asks once for its
    entries (when a workload view says ``wire.DOWNLOADS``: ``presigned``) instead of one
    redirected GET each. Stored entries the service signs no URL for (presigned downloads off,
    a file blob store) are listed in ``inline``: GET those."""
    answer = store.entries.download_urls(namespace, body.entries, settings.presign_expires_s if settings.presigned_downloads else None)
    for url in answer.urls:
        record_batch_lookups(request, 1, 0, url.layer)
        downloads.record(settings, request, namespace, url.layer, url.key, "url", 0)
    for ref in answer.missing:
        record_batch_lookups(request, 0, 1, ref.layer)
    return answer


@router.head(wire.ENTRY, summary="Whether an entry exists", response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}}, "description": "Stored: the GET's headers (Content-Length: the entry's size), no body"}})
def head_entry(namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, _: CanRead) -> Response:
    info = store.entries.info(namespace, layer, key)
    headers = _headers(info) | {"Content-Length": str(info.size)}
    return Response(status_code=200, media_type="application/octet-stream", headers=headers)


@router.get(wire.ENTRY_INFO, response_model=EntryInfo, summary="An entry's metadata, with its signer and provenance if signed")
def entry_info(namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, _: CanRead) -> EntryInfo:
    return store.entries.info(namespace, layer, key)


@router.get(wire.ENTRY_LIST, response_model=EntryList, summary="List a layer's entries (paginated, in key order)")
def list_entries(
    namespace: Namespace, layer: Layer, store: StoreDep, _: CanRead,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str, Query(max_length=512, pattern=ENTRY_KEY_PREFIX_PATTERN)] = "",
    prefix: Annotated[str, Query(max_length=512, pattern=ENTRY_KEY_PREFIX_PATTERN)] = "",
) -> EntryList:
    items = store.entries.listing(namespace, layer, cursor, prefix, limit + 1)
    next_cursor = items[limit - 1].key if len(items) > limit else None
    return EntryList(items=items[:limit], next_cursor=next_cursor)


@router.delete(wire.ENTRY, status_code=204, summary="Remove an entry (admin)")
def delete_entry(namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, _: CanAdmin) -> Response:
    store.entries.delete(namespace, layer, key)
    return Response(status_code=204)


@router.post(wire.ENTRY_QUARANTINE, status_code=201, response_model=QuarantineInfo,
             summary="Report an entry torch could not load (or a canary found unsound): out of service for every node",
             responses={200: {"model": QuarantineInfo, "description": "Quarantined already: the report in force"}})
def quarantine_entry(
    body: QuarantineRequest, response: Response, namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep,
    _: CanWrite, x_kcache_producer: Annotated[str | None, Header(max_length=256)] = None,
) -> QuarantineInfo:
    info, created = store.quarantine.report(namespace, layer, key, body.reason, body.sha256, x_kcache_producer)
    response.status_code = 201 if created else 200
    return info


@router.get(wire.ENTRY_QUARANTINE, response_model=QuarantineInfo, summary="Why an entry is quarantined")
def quarantine_info(namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, _: CanRead) -> QuarantineInfo:
    return store.quarantine.info(namespace, layer, key)


@router.delete(wire.ENTRY_QUARANTINE, status_code=204, summary="Lift a quarantine: the key takes uploads again (admin)")
def lift_quarantine(namespace: Namespace, layer: Layer, key: EntryKey, store: StoreDep, _: CanAdmin) -> Response:
    store.quarantine.lift(namespace, layer, key)
    return Response(status_code=204)
