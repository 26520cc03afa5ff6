"""Responses that carry stored bytes: held in memory, or streamed from the blob store.

A body handed to the transport in one piece is copied into the transport's buffer for all it
cannot send at once, so a large body was held twice until the client had read it. Bodies over
``_CHUNK`` go out as a stream of pieces instead: the transport's flow control then holds at most
a piece or two beside what the route holds. Small bodies (nearly every kernel pack) stay a plain
:class:`Response`, the fastest path.

A blob (:func:`blob_response`) is never held whole when it is large: it is read from the blob
store a chunk at a time as the client takes it, so N concurrent readers of one 48 MiB pack hold
N chunks, not N copies of the pack (issue #31: 16 such readers took a worker from 61 MB to
862 MB of RSS). Batch gets stream their tar the same way (:func:`tar_stream`).
"""

from __future__ import annotations

import logging
import tarfile
from collections.abc import AsyncIterator, Iterator

from fastapi import Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from kcache_server.storage import BlobStream

_CHUNK = 1 << 20
# Starlette runs each step of a sync iterator in the threadpool; one hop per tar member was most
# of the time of a bulk pull of small packs. A batch hands over about this much at a time.
_BATCH_CHUNK = 256 << 10

log = logging.getLogger("kcache_server.responses")


def bytes_response(data: bytes, media_type: str, headers: dict[str, str]) -> Response:
    if len(data) <= _CHUNK:
        return Response(data, media_type=media_type, headers=headers)

    async def pieces() -> AsyncIterator[bytes]:
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK):
            yield bytes(view[start : start + _CHUNK])

    return StreamingResponse(pieces(), media_type=media_type, headers=headers | {"Content-Length": str(len(data))})


def blob_response(blob: BlobStream, media_type: str, headers: dict[str, str]) -> Response:
    """The blob as the response body; closes it. Called from a sync route (in the threadpool),
    which may read a small blob whole."""
    if blob.size <= _CHUNK:
        with blob:
            return Response(blob.read(), media_type=media_type, headers=headers)

    async def pieces() -> AsyncIterator[bytes]:
        chunks = iter(blob)
        try:
            # Reads block (a disk, S3): each in the threadpool, between them only the event loop.
            while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
                yield chunk
        finally:
            blob.close()  # also when the client went away halfway

    return StreamingResponse(pieces(), media_type=media_type, headers=headers | {"Content-Length": str(blob.size)})


def tar_stream(first: tuple[str, bytes], members: Iterator[tuple[str, BlobStream]]) -> Iterator[bytes]:
    """An uncompressed tar (PAX headers, as ``tarfile``'s stream writer makes it): ``first``,
    then each member streamed from its blob, closed once written (or when the stream stops)."""
    pending: list[bytes] = []
    size = 0
    written = 0

    def add(piece: bytes) -> bytes | None:
        nonlocal size, written
        pending.append(piece)
        size += len(piece)
        written += len(piece)
        if size < _BATCH_CHUNK:
            return None
        out = b"".join(pending)
        pending.clear()
        size = 0
        return out

    def header(name: str, length: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.size, info.mode = length, 0o644
        return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")

    name, data = first
    add(header(name, len(data)) + data + _padding(len(data)))
    streamed = 0  # members whose last byte went out
    finished = False
    try:
        for name, blob in members:
            with blob:
                if (out := add(header(name, blob.size))) is not None:
                    yield out
                for chunk in blob:
                    if (out := add(chunk)) is not None:
                        yield out
                if (out := add(_padding(blob.size))) is not None:
                    yield out
            streamed += 1
        # The end: two zero blocks, then zeros up to a whole record, as tarfile closes an archive.
        end = 2 * tarfile.BLOCKSIZE
        end += -(written + end) % tarfile.RECORDSIZE
        add(bytes(end))
        yield b"".join(pending)
        finished = True
    finally:
        if not finished:  # the client left, or a read failed (logged apart): which, and where, is the clue
            log.warning("a streamed tar stopped after %d members (%d bytes made): the client went away or a blob read failed",
                        streamed, written)


def _padding(size: int) -> bytes:
    return bytes(-size % tarfile.BLOCKSIZE)
