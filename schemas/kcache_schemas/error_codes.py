"""Errors on the wire, spelled once for both sides.

The service answers every error as :class:`ErrorBody` (``{"error": {"code", "message",
"detail"?}}``) with the status :data:`STATUS` gives its code; the client reads the body with
:meth:`ErrorBody.parse` and maps the code (not the message) to an exception
(huggingface_hub's ``errors.py`` + ``hf_raise_for_status`` habit).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class ErrorCode(str, Enum):
    INVALID_KEY = "invalid_key"
    INVALID_PACK = "invalid_pack"
    INVALID_REQUEST = "invalid_request"
    KEY_MISMATCH = "key_mismatch"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    # An entry a client reported torch could not load (POST .../quarantine): answered like a
    # missing one, so every node compiles, and told apart so nobody mistakes it for a cold cache.
    QUARANTINED = "quarantined"
    TOO_LARGE = "too_large"
    INSUFFICIENT_STORAGE = "insufficient_storage"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    # An entry upload to a namespace with registered producer keys that none of them signed.
    UNTRUSTED_SIGNATURE = "untrusted_signature"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    OVERLOADED = "overloaded"  # the replica's memory budget is spent: retry after Retry-After
    REQUEST_TIMEOUT = "request_timeout"  # the request body did not arrive in time
    INTERNAL = "internal"


# The HTTP status of each code. INVALID_REQUEST is 400 for a request the service refuses and 422
# for a body that fails validation: the service passes the status where the two differ.
STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_KEY: 400,
    ErrorCode.INVALID_PACK: 400,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.KEY_MISMATCH: 400,
    ErrorCode.CONFLICT: 409,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.QUARANTINED: 404,  # 409 for an upload of a quarantined key (the service passes it)
    ErrorCode.TOO_LARGE: 413,
    # The namespace is at its hard storage limit (bazel-remote's answer): the upload is refused,
    # nothing stored is touched, and the service's GC is already making room.
    ErrorCode.INSUFFICIENT_STORAGE: 507,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNTRUSTED_SIGNATURE: 403,
    ErrorCode.BACKEND_UNAVAILABLE: 503,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.INTERNAL: 500,
}


class ErrorDetail(BaseModel):
    # ``code`` stays a string: a newer service may answer a code this client does not know.
    model_config = ConfigDict(extra="ignore", frozen=True)

    code: str
    message: str
    detail: Any = None


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    error: ErrorDetail

    @classmethod
    def of(cls, code: ErrorCode, message: str, detail: Any = None) -> ErrorBody:
        return cls(error=ErrorDetail(code=code.value, message=message, detail=detail))

    @classmethod
    def parse(cls, body: bytes) -> ErrorDetail | None:
        """The error a response body carries, or None when it is not an error body (a proxy's
        HTML page, a truncated answer)."""
        try:
            return cls.model_validate_json(body).error
        except ValidationError:
            return None

    def content(self) -> dict[str, Any]:
        """The JSON body (``detail`` only when there is one)."""
        err: dict[str, Any] = {"code": self.error.code, "message": self.error.message}
        if self.error.detail is not None:
            err["detail"] = self.error.detail
        return {"error": err}


class PackError(ValueError):
    """A kernel pack (or a kernel dir being packed) is malformed or unsafe.

    ``code`` says which family of problem it is so the service can answer 400/413 and the client
    can count it; the message names the offending file or field.
    """

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_PACK) -> None:
        super().__init__(message)
        self.code = code
