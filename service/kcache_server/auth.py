"""Bearer tokens with read / write / admin scopes per namespace.

``admin`` implies ``write`` implies ``read``. With no tokens configured the service is open, which
``Settings.check_bind`` allows on loopback only.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from kcache_schemas import wire
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from kcache_server.domain_errors import Forbidden, Unauthorized
from kcache_server.settings import Scope, TokenGrant

_IMPLIED: dict[str, set[str]] = {"admin": {"admin", "write", "read"}, "write": {"write", "read"}, "read": {"read"}}


@dataclass(frozen=True)
class Principal:
    name: str
    namespaces: frozenset[str]
    scopes: frozenset[str]

    def allows(self, namespace: str, scope: Scope) -> bool:
        return scope in self.scopes and ("*" in self.namespaces or namespace in self.namespaces)


OPEN = Principal("anonymous (open server)", frozenset({"*"}), frozenset({"read", "write", "admin"}))


class Authenticator:
    def __init__(self, grants: list[TokenGrant]) -> None:
        # Keep only digests: compare in constant time and never hold more plaintext than needed.
        self._grants = [
            (
                hashlib.sha256(g.token.get_secret_value().encode()).digest(),
                Principal(
                    g.name,
                    frozenset(g.namespaces),
                    frozenset(s for scope in g.scopes for s in _IMPLIED[scope]),
                ),
            )
            for g in grants
        ]

    @property
    def open(self) -> bool:
        return not self._grants

    def authenticate(self, authorization: str | None) -> Principal:
        if self.open:
            return OPEN
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        digest = hashlib.sha256(authorization[7:].strip().encode()).digest()
        match = None
        for stored, principal in self._grants:
            if hmac.compare_digest(stored, digest):
                match = principal
        if match is None:
            raise Unauthorized("unknown bearer token")
        return match

    def authorize(self, authorization: str | None, namespace: str, scope: Scope) -> Principal:
        principal = self.authenticate(authorization)
        if not principal.allows(namespace, scope):
            raise Forbidden(f"token {principal.name!r} lacks {scope!r} on namespace {namespace!r}")
        return principal


class OpenServerNotice:
    """On a server without tokens, every response says so (``wire.AUTH_MODE``): a client
    that sends a token can tell its user the token is not checked. ASGI, not a
    ``BaseHTTPMiddleware``: streamed downloads pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append(wire.AUTH_MODE, wire.AUTH_OPEN)
            await send(message)

        await self.app(scope, receive, send_noting)
