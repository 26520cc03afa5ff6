"""The one mapping from errors to HTTP responses.

Every error leaves as :class:`kcache_schemas.ErrorBody` (``{"error": {"code", "message"}}``) with
the status ``kcache_schemas.errors.STATUS`` gives its code; no stack traces.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kcache_schemas import ErrorBody, ErrorCode, InvalidKeyError, PackError
from kcache_schemas.errors import STATUS
from starlette.exceptions import HTTPException as StarletteHTTPException

from kcache_server.errors import InvalidBody, ServiceError
from kcache_server.storage import BackendUnavailable

log = logging.getLogger("kcache_server")
VALIDATION_STATUS = 422


def error_response(code: ErrorCode, message: str, detail: Any = None, *, status: int | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorBody.of(code, message, detail).content(), status_code=status or STATUS[code], headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service(_: Request, exc: ServiceError) -> JSONResponse:
        status = VALIDATION_STATUS if isinstance(exc, InvalidBody) else None
        return error_response(exc.code, exc.message, exc.detail, status=status)

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
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.INVALID_REQUEST
        return error_response(code, str(exc.detail), status=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(ErrorCode.INTERNAL, "internal error; see server log")
