"""Kernel packs: ``/v1/{namespace}/kernels``."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, StreamingResponse
from kcache_schemas import InvalidKeyError, KernelEntry, wire
from kcache_schemas.models import (
    BatchGetRequest,
    BatchUrls,
    KernelList,
    MissingRequest,
    MissingResponse,
    validate_filename,
)
from kcache_schemas.pack import MEDIA_TYPE

from kcache_server import downloads
from kcache_server.deps import (
    CanAdmin,
    CanRead,
    CanWrite,
    KernelKey,
    Namespace,
    SettingsDep,
    StoreDep,
    read_body,
)
from kcache_server.metrics import record_batch_lookups
from kcache_server.responses import blob_response, bytes_response, tar_stream

router = APIRouter(tags=["kernels"])

_TEXT_SUFFIXES = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".json")


def _entry_headers(entry: KernelEntry) -> dict[str, str]:
    return {
        "ETag": f'"{entry.content_digest}"',
        wire.TOTAL_SIZE: str(entry.total_size),
        wire.TARGET: f"{entry.target.device_type.value}:{entry.target.arch}:{entry.target.warp_size}",
        "Cache-Control": "public, max-age=31536000, immutable",
    }


@router.put(wire.KERNEL, status_code=201, response_model=KernelEntry, summary="Upload a kernel pack",
            responses={200: {"model": KernelEntry, "description": "Identical content was stored already: nothing changed"}})
async def put_kernel(
    request: Request, response: Response, namespace: Namespace, key: KernelKey,
    store: StoreDep, settings: SettingsDep, _: CanWrite,
) -> KernelEntry:
    """Verifies every file's size and sha256 and that the pack is for ``key``. Write-once:
    re-uploading identical content answers 200, different content 409."""
    with store.budget.hold() as share:
        body = await read_body(request, settings.max_pack_bytes, share)
        entry, created = await run_in_threadpool(store.kernels.put, namespace, key, body, share)
    response.status_code = 201 if created else 200
    return entry


@router.get(wire.KERNEL, summary="Download a kernel pack", response_class=Response,
            responses={200: {"content": {MEDIA_TYPE: {}}}, 307: {"description": "presigned blob URL"}})
def get_kernel(
    request: Request, namespace: Namespace, key: KernelKey, store: StoreDep, settings: SettingsDep, _: CanRead,
) -> Response:
    if settings.presigned_downloads:
        url = store.kernels.download_url(namespace, key, settings.presign_expires_s)
        if url is not None:
            downloads.record(settings, request, namespace, downloads.KERNEL_LAYER, key, "redirect", 0)
            return RedirectResponse(url, status_code=307)
    entry, blob = store.kernels.open_pack(namespace, key)
    downloads.record(settings, request, namespace, downloads.KERNEL_LAYER, key, "get", blob.size)
    return blob_response(blob, MEDIA_TYPE, _entry_headers(entry))


@router.head(wire.KERNEL, summary="Whether a kernel exists, and its pack size", response_class=Response,
             responses={200: {"content": {MEDIA_TYPE: {}}, "description": "Stored: the GET's headers (Content-Length: the pack's size), no body"}})
def head_kernel(namespace: Namespace, key: KernelKey, store: StoreDep, _: CanRead) -> Response:
    entry = store.kernels.manifest(namespace, key)
    headers = _entry_headers(entry) | {"Content-Length": str(entry.pack_size)}
    return Response(status_code=200, media_type=MEDIA_TYPE, headers=headers)


@router.get(wire.KERNEL_MANIFEST, response_model=KernelEntry, summary="A kernel's manifest")
def get_manifest(namespace: Namespace, key: KernelKey, store: StoreDep, _: CanRead) -> KernelEntry:
    return store.kernels.manifest(namespace, key)


@router.get(wire.KERNEL_FILE, summary="One raw file of a kernel (e.g. the .ptx)")
def get_file(namespace: Namespace, key: KernelKey, filename: str, store: StoreDep, _: CanRead) -> Response:
    try:
        validate_filename(filename)
    except ValueError as exc:
        raise InvalidKeyError(str(exc)) from exc
    data = store.kernels.file(namespace, key, filename)
    text = filename.endswith(_TEXT_SUFFIXES)
    media = "application/json" if filename.endswith(".json") else "text/plain; charset=utf-8" if text else "application/octet-stream"
    return bytes_response(data, media, {"Content-Disposition": f'inline; filename="{filename}"'})


@router.delete(wire.KERNEL, status_code=204, summary="Remove a kernel (admin)")
def delete_kernel(namespace: Namespace, key: KernelKey, store: StoreDep, _: CanAdmin) -> Response:
    store.kernels.delete(namespace, key)
    return Response(status_code=204)


@router.post(wire.KERNELS_MISSING, response_model=MissingResponse, summary="Which of these keys are not stored")
def missing_kernels(body: MissingRequest, namespace: Namespace, store: StoreDep, _: CanRead) -> MissingResponse:
    missing, invalid = store.kernels.missing(namespace, body.keys)
    return MissingResponse(missing=missing, invalid=invalid)


@router.post(wire.KERNELS_BATCH_GET, summary="Many packs in one streamed response",
             response_class=StreamingResponse, responses={200: {"content": {"application/x-tar": {}}}})
def batch_get(
    request: Request, body: BatchGetRequest, namespace: Namespace, store: StoreDep, settings: SettingsDep, _: CanRead,
) -> StreamingResponse:
    """An uncompressed tar stream: first ``index.json`` (``{"found": [...], "missing": [...],
    "invalid": [...]}``), then ``<key>.kpack`` for each found key, in that order. Packs are
    already compressed, so the outer tar adds only headers."""
    batch = store.kernels.batch_get(namespace, body.keys)
    record_batch_lookups(request, len(batch.found), len(batch.missing))
    index = {"found": batch.found, "missing": batch.missing, "invalid": batch.invalid}
    packs = ((wire.batch_member(key), blob) for key, blob in downloads.batch_packs(settings, request, namespace, batch.packs))
    stream = tar_stream((wire.BATCH_INDEX, json.dumps(index).encode()), packs)
    return StreamingResponse(stream, media_type="application/x-tar")


@router.post(wire.KERNELS_BATCH_URLS, response_model=BatchUrls, summary="Presigned object-store URLs for many packs")
def batch_urls(request: Request, body: BatchGetRequest, namespace: Namespace, store: StoreDep, settings: SettingsDep,
               _: CanRead) -> BatchUrls:
    """One index read and a signature per found key: the packs then flow from the object store,
    not through this service (a prefetch asks for these when a workload view says
    ``wire.DOWNLOADS``: ``presigned``). Found keys the service signs no URL for (presigned
    downloads off, a file blob store) are listed in ``inline``: fetch them through batch-get."""
    answer = store.kernels.download_urls(namespace, body.keys, settings.presign_expires_s if settings.presigned_downloads else None)
    record_batch_lookups(request, len(answer.urls), len(answer.missing))  # inline ones: counted by their batch-get
    for key in answer.urls:
        downloads.record(settings, request, namespace, downloads.KERNEL_LAYER, key, "url", 0)
    return answer


@router.get(wire.KERNELS, response_model=KernelList, summary="List kernels (paginated)")
def list_kernels(
    namespace: Namespace, store: StoreDep, _: CanRead,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str, Query(max_length=64)] = "",
    prefix: Annotated[str, Query(max_length=52, pattern=r"^[A-Z2-7]*$")] = "",
) -> KernelList:
    items = store.kernels.listing(namespace, cursor, prefix, limit + 1)
    next_cursor = items[limit - 1].key if len(items) > limit else None
    return KernelList(items=items[:limit], next_cursor=next_cursor)


