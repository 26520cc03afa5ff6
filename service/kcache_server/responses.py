"""Responses for bytes held in memory.

A body handed to the transport in one piece is copied into the transport's buffer for all it
cannot send at once, so a large body was held twice until the client had read it. Bodies over
``_CHUNK`` go out as a stream of ``_CHUNK`` pieces instead: the transport's flow control then
holds at most a piece or two beside the body. Small bodies (nearly every kernel pack) stay a
plain :class:`Response`, the fastest path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Response
from fastapi.responses import StreamingResponse

_CHUNK = 1 << 20


def bytes_response(data: bytes, media_type: str, headers: dict[str, str]) -> Response:
    if len(data) <= _CHUNK:
        return Response(data, media_type=media_type, headers=headers)

    async def pieces() -> AsyncIterator[bytes]:
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK):
            yield bytes(view[start : start + _CHUNK])

    return StreamingResponse(pieces(), media_type=media_type, headers=headers | {"Content-Length": str(len(data))})
