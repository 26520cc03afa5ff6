"""Client exceptions and the one mapping from the service's error codes to them
(huggingface_hub's ``hf_raise_for_status`` habit)."""

from __future__ import annotations

import httpx
from kcache_schemas import ErrorBody, ErrorCode
from kcache_schemas.error_codes import STATUS


class KcacheError(Exception):
    """Base of every kcache client error."""


class ConfigError(KcacheError, ValueError):
    """A setting (a ``KCACHE_*`` variable or an ``install()`` argument) does not parse: the message
    names each one and what it accepts. ``kcache.install()`` raises it; where kcache activates by
    itself (``KCACHE_URL`` at interpreter start) it is one warning and kcache stays off."""


class ServiceUnavailable(KcacheError):
    """The service could not be reached, timed out, answered 5xx, or the breaker is open.

    Counted as an *error*, never as a miss: a degraded cache must not pose as a cold one.
    """


class NotFound(KcacheError):
    """The service has no such kernel or entry (a miss)."""


class Quarantined(NotFound):
    """A node reported that torch could not load this entry: the service serves it to nobody
    (a miss, told apart from a cold one) and refuses uploads of its key."""


class Conflict(KcacheError):
    """Write-once: the service holds different content under this key."""


class AuthError(KcacheError):
    """The token is missing, unknown, or lacks the scope."""


class BadRequest(KcacheError):
    """The service refused what we sent (invalid key or pack, too large)."""


class SignatureRefused(KcacheError):
    """The namespace takes only entries signed by its registered producer keys, and ours is not."""


class StorageFull(KcacheError):
    """The namespace is at its storage limit (507): the upload is refused; reads go on."""


class InvalidPack(KcacheError):
    """A pack from the service failed verification; nothing was written."""


_BY_CODE: dict[str, type[KcacheError]] = {
    ErrorCode.NOT_FOUND.value: NotFound,
    ErrorCode.QUARANTINED.value: Quarantined,
    ErrorCode.CONFLICT.value: Conflict,
    ErrorCode.UNAUTHORIZED.value: AuthError,
    ErrorCode.FORBIDDEN.value: AuthError,
    ErrorCode.UNTRUSTED_SIGNATURE.value: SignatureRefused,
    ErrorCode.BACKEND_UNAVAILABLE.value: ServiceUnavailable,
}


def raise_for_status(response: httpx.Response) -> None:
    if response.is_success or response.is_redirect:
        return
    err = ErrorBody.parse(response.content)
    code, message = (err.code, err.message) if err is not None else ("", response.text[:300])
    if code == ErrorCode.INSUFFICIENT_STORAGE.value or response.status_code == STATUS[ErrorCode.INSUFFICIENT_STORAGE]:
        raise StorageFull(f"HTTP {response.status_code} {code}: {message}")
    if response.status_code >= 500:
        raise ServiceUnavailable(f"HTTP {response.status_code}: {message}")
    exc = _BY_CODE.get(code)
    if exc is None:
        exc = {404: NotFound, 409: Conflict, 401: AuthError, 403: AuthError}.get(response.status_code, BadRequest)
    raise exc(f"HTTP {response.status_code} {code}: {message}")
