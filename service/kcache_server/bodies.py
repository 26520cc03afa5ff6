"""Request bodies arrive in time, or not at all: an ASGI middleware.

uvicorn bounds only idle keep-alive connections; a client that starts an upload and stalls held
its connection and the bytes it had sent for as long as it liked. While a request's body is
still arriving, every ``receive`` must bring the next part within ``idle_s``, and the whole body
must have arrived ``total_s`` after the request started; otherwise the service answers ``408``
with ``Connection: close`` and the route sees the client as gone.

A client that closes the connection before its body is complete is not a server error: it is
logged at info, and the request's response, which nobody will read, is counted with status
``499`` (nginx's "client closed request"). Requests without a body (GET, HEAD) pass untouched;
after the body, ``receive`` is left alone (streaming responses wait on it for a disconnect).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
from kcache_schemas import ErrorCode

from kcache_server.domain_errors import BodyTimeout
from kcache_server.handlers import CLIENT_CLOSED, error_response

log = logging.getLogger("kcache_server.bodies")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


class BodyDeadline:
    def __init__(self, app: ASGIApp, idle_s: float, total_s: float) -> None:
        self.app, self.idle_s, self.total_s = app, idle_s, total_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.total_s
        state = {"body_done": False, "gone": False, "started": False, "answered": False, "received": 0}

        async def timely_receive() -> Message:
            if state["body_done"]:
                return await receive()
            wait = min(self.idle_s, deadline - time.monotonic())
            message: Message | None = None
            if wait > 0:
                with anyio.move_on_after(wait):
                    message = await receive()
            if message is None:
                state["body_done"] = True
                await self._time_out(scope, send, state)
                return {"type": "http.disconnect"}
            if message["type"] == "http.disconnect":
                state["body_done"] = state["gone"] = True
                log.info(
                    "client closed the connection during the request body: %s %s (%d bytes received)",
                    scope.get("method"), scope.get("path"), state["received"],
                )
            elif message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                state["body_done"] = not message.get("more_body", False)
            return message

        async def answering_send(message: Message) -> None:
            if state["answered"]:
                return  # we answered 408 already: the route's own answer has nobody to go to
            if message["type"] == "http.response.start":
                state["started"] = True
                if state["gone"]:
                    message = {**message, "status": CLIENT_CLOSED}  # for the metrics; never sent
            await send(message)

        await self.app(scope, timely_receive, answering_send)

    async def _time_out(self, scope: Scope, send: Send, state: dict[str, Any]) -> None:
        exc = BodyTimeout(
            f"request body not received in time: {state['received']} bytes arrived; a body must "
            f"arrive within {self.total_s:g} s, with at most {self.idle_s:g} s between its parts"
        )
        log.info("%s %s: %s", scope.get("method"), scope.get("path"), exc.message)
        if state["started"]:
            return  # the route answered before reading its whole body: nothing to replace
        response = error_response(ErrorCode.REQUEST_TIMEOUT, exc.message, headers=exc.headers)
        await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})
        state["answered"] = True
