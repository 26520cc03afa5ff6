"""The service's domain errors: what a request can be refused for, by wire code.

The store's concerns (:mod:`kcache_server.store`) and auth raise these; they know nothing of HTTP.
:mod:`kcache_server.handlers` maps them (and the schemas' and storage's errors) to responses,
in one place.
"""

from __future__ import annotations

from typing import Any

from kcache_schemas import ErrorCode


class ServiceError(Exception):
    """A request the service refuses; ``code`` decides the status (``kcache_schemas.error_codes.STATUS``),
    ``headers`` go with the answer (what HTTP asks of that status)."""

    code: ErrorCode = ErrorCode.INVALID_REQUEST
    headers: dict[str, str] | None = None
    status: int | None = None  # where it differs from the code's (kcache_schemas.error_codes.STATUS)

    def __init__(self, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.message, self.detail = message, detail


class NotFound(ServiceError):
    code = ErrorCode.NOT_FOUND

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} not found")


class Quarantined(ServiceError):
    """The entry was reported unloadable (:meth:`kcache_server.store.quarantine.Quarantine.report`): a miss for
    readers, with the reason in ``detail``."""

    code = ErrorCode.QUARANTINED

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} is quarantined: {reason}", {"reason": reason})


class QuarantinedUpload(Quarantined):
    """An upload of a quarantined key: refused (409) until an admin lifts the quarantine."""

    status = 409


class Conflict(ServiceError):
    """Write-once: different content for a key that is already stored."""

    code = ErrorCode.CONFLICT


class KeyMismatch(ServiceError):
    code = ErrorCode.KEY_MISMATCH


class InvalidRequest(ServiceError):
    code = ErrorCode.INVALID_REQUEST


class InvalidBody(InvalidRequest):
    """A body that parses but fails its schema (answered 422, as FastAPI's own validation)."""


class TooLarge(ServiceError):
    code = ErrorCode.TOO_LARGE


class InsufficientStorage(ServiceError):
    """The namespace is at its hard storage limit (507)."""

    code = ErrorCode.INSUFFICIENT_STORAGE


class GcBusy(ServiceError):
    """Another GC holds the lease (on this or another replica)."""

    code = ErrorCode.CONFLICT


class Unauthorized(ServiceError):
    code = ErrorCode.UNAUTHORIZED
    # RFC 9110 §11.6.1: a 401 names the scheme that would be accepted (RFC 6750 for bearer tokens).
    headers = {"WWW-Authenticate": 'Bearer realm="kcache"'}


class Forbidden(ServiceError):
    code = ErrorCode.FORBIDDEN


class UntrustedSignature(ServiceError):
    """An entry upload that no producer key registered for its namespace signed."""

    code = ErrorCode.UNTRUSTED_SIGNATURE


class Overloaded(ServiceError):
    """The replica's memory budget cannot take this request now (:mod:`kcache_server.memory_budget`)."""

    code = ErrorCode.OVERLOADED
    headers = {"Retry-After": "1"}


class BodyTimeout(ServiceError):
    """The request body did not arrive in time (:mod:`kcache_server.bodies`)."""

    code = ErrorCode.REQUEST_TIMEOUT
    headers = {"Connection": "close"}  # the rest of the body may still be on its way
