"""The one mapping from errors to HTTP responses.

Every error leaves as :class:`kcache_schemas.ErrorBody` (``{"error": {"code", "message"}}``) with
the status ``kcache_schemas.error_codes.STATUS`` gives its code; no stack traces.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kcache_schemas import ErrorBody, ErrorCode, InvalidKeyError, PackError
from kcache_schemas.error_codes import STATUS
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from kcache_server.domain_errors import InvalidBody, ServiceError
from kcache_server.storage import BackendUnavailable

log = logging.getLogger("kcache_server")
VALIDATION_STATUS = 422
CLIENT_CLOSED = 499  # nginx's "client closed request": counted apart from errors of ours


def error_response(code: ErrorCode, message: str, detail: Any = None, *, status: int | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorBody.of(code, message, detail).content(), status_code=status or STATUS[code], headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service(_: Request, exc: ServiceError) -> JSONResponse:
        status = VALIDATION_STATUS if isinstance(exc, InvalidBody) else exc.status
        return error_response(exc.code, exc.message, exc.detail, status=status, headers=exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> Response:
        # The client closed the connection before its body was complete (logged by
        # kcache_server.bodies): not an error of ours, and nobody reads this answer.
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(PackError)
    async def _pack(_: Request, exc: PackError) -> JSONResponse:
        return error_response(exc.code, str(exc))

    @app.exception_handler(InvalidKeyError)
    async def _key(_: Request, exc: InvalidKeyError) -> JSONResponse:
        return error_response(ErrorCode.INVALID_KEY, str(exc))

    @app.exception_handler(BackendUnavailable)
    async def _backend(_: Request, exc: BackendUnavailable) -> JSONResponse:
        log.warning("backend unavailable: %s", exc)
        return error_response(ErrorCode.BACKEND_UNAVAILABLE, f"storage backend unavailable: {exc}", headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        msg = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return error_response(ErrorCode.INVALID_REQUEST, msg, errors, status=VALIDATION_STATUS)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.INVALID_REQUEST
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route that matched the path; a path has
            # one route per method here, and RFC 9110 §15.5.6 asks for all of them.
            headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
        return error_response(code, str(exc.detail), status=exc.status_code, headers=headers or None)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(ErrorCode.INTERNAL, "internal error; see server log")


def allowed_methods(app: FastAPI, scope: Any) -> list[str]:
    """Every method some route serves at the request's path (HEAD where GET is)."""
    path = scope.get("path", "")
    methods: set[str] = set()
    for route in _flat_routes(app.router.routes):
        if route.path_regex.match(path):
            methods |= set(route.methods)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def _flat_routes(routes: Any) -> Iterator[Any]:
    """Routes with a path and methods. Newer FastAPI (0.165 here) keeps an included router's
    routes inside a wrapper (``original_router``; the service includes its routers unprefixed)."""
    for route in routes:
        if getattr(route, "path_regex", None) is not None and getattr(route, "methods", None):
            yield route
        else:
            yield from _flat_routes(getattr(getattr(route, "original_router", None), "routes", ()))
