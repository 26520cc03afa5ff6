"""One error type for the API and one mapping to JSON responses.

Every error leaves as ``{"error": {"code", "message"}}`` with a 4xx/5xx status; no stack traces.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kcache_schemas import ErrorCode, InvalidKeyError, PackError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kcache_server.storage import BackendUnavailable

log = logging.getLogger("kcache_server")

_PACK_STATUS = {ErrorCode.TOO_LARGE: 413, ErrorCode.KEY_MISMATCH: 400, ErrorCode.INVALID_KEY: 400}


class ApiError(Exception):
    def __init__(self, status: int, code: ErrorCode, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail


def not_found(what: str) -> ApiError:
    return ApiError(404, ErrorCode.NOT_FOUND, f"{what} not found")


def _body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if detail is not None:
        err["detail"] = detail
    return {"error": err}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(_body(exc.code.value, exc.message, exc.detail), status_code=exc.status)

    @app.exception_handler(PackError)
    async def _pack(_: Request, exc: PackError) -> JSONResponse:
        return JSONResponse(_body(exc.code.value, str(exc)), status_code=_PACK_STATUS.get(exc.code, 400))

    @app.exception_handler(InvalidKeyError)
    async def _key(_: Request, exc: InvalidKeyError) -> JSONResponse:
        return JSONResponse(_body(ErrorCode.INVALID_KEY.value, str(exc)), status_code=400)

    @app.exception_handler(BackendUnavailable)
    async def _backend(_: Request, exc: BackendUnavailable) -> JSONResponse:
        log.warning("backend unavailable: %s", exc)
        return JSONResponse(
            _body(ErrorCode.BACKEND_UNAVAILABLE.value, f"storage backend unavailable: {exc}"),
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in exc.errors()
        ]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        msg = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return JSONResponse(_body(ErrorCode.INVALID_REQUEST.value, msg, errors), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.INVALID_REQUEST
        return JSONResponse(_body(code.value, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(_body(ErrorCode.INTERNAL.value, "internal error; see server log"), status_code=500)
