"""Error codes on the wire.

The service answers every error as ``{"error": {"code": ..., "message": ...}}``; the client maps
the code (not the message) to an exception. One list, used by both sides.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    INVALID_KEY = "invalid_key"
    INVALID_PACK = "invalid_pack"
    INVALID_REQUEST = "invalid_request"
    KEY_MISMATCH = "key_mismatch"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    INTERNAL = "internal"


class PackError(ValueError):
    """A kernel pack (or a kernel dir being packed) is malformed or unsafe.

    ``code`` says which family of problem it is so the service can answer 400/413 and the client
    can count it; the message names the offending file or field.
    """

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_PACK) -> None:
        super().__init__(message)
        self.code = code
