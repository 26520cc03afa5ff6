"""FastAPI dependencies: the store, validated path parameters, and scope checks.

All of them are ``async def``: they only read app state and validate strings. FastAPI runs a
plain ``def`` dependency in the thread pool, and with one hop per dependency the hops were
most of the cost of a kernel GET (they never block, so the event loop is the right place).
"""

from __future__ import annotations

import io
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from kcache_schemas import (
    normalize_entry_key,
    normalize_kernel_key,
    validate_layer,
    validate_namespace,
)

from kcache_server.auth import Authenticator, Principal
from kcache_server.domain_errors import TooLarge
from kcache_server.memory_budget import Hold
from kcache_server.settings import Settings
from kcache_server.store import CacheStore


async def get_store(request: Request) -> CacheStore:
    return request.app.state.store  # type: ignore[no-any-return]


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def get_auth(request: Request) -> Authenticator:
    return request.app.state.auth  # type: ignore[no-any-return]


async def _namespace(namespace: Annotated[str, Path(description="e.g. a team or environment")]) -> str:
    return validate_namespace(namespace)


async def _kernel_key(key: Annotated[str, Path(description="Triton cache-dir name (52 base32) or 64-hex hash")]) -> str:
    return normalize_kernel_key(key)


async def _layer(layer: Annotated[str, Path(description="fx-graph, autotune, bundled-autotune, aot-autograd, dynamo-pgo, triton-module, dynamo, jit, vllm")]) -> str:
    return validate_layer(layer)


async def _entry_key(key: str) -> str:
    return normalize_entry_key(key)


StoreDep = Annotated[CacheStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Namespace = Annotated[str, Depends(_namespace)]
KernelKey = Annotated[str, Depends(_kernel_key)]
Layer = Annotated[str, Depends(_layer)]
EntryKey = Annotated[str, Depends(_entry_key)]


def _scope_checker(scope: str):  # type: ignore[no-untyped-def]
    async def check(
        namespace: Namespace,
        auth: Annotated[Authenticator, Depends(get_auth)],
        authorization: Annotated[str | None, Header()] = None,
    ) -> Principal:
        return auth.authorize(authorization, namespace, scope)  # type: ignore[arg-type]

    return check


CanRead = Annotated[Principal, Depends(_scope_checker("read"))]
CanWrite = Annotated[Principal, Depends(_scope_checker("write"))]
CanAdmin = Annotated[Principal, Depends(_scope_checker("admin"))]


async def read_body(request: Request, limit: int, share: Hold) -> bytes:
    """Read the request body, refusing (413) past ``limit`` bytes without buffering the excess.

    Each chunk is taken from the replica's memory budget (``share``) as it arrives, never the
    declared ``Content-Length`` ahead of its bytes (see :mod:`kcache_server.memory_budget`); a declared
    size that does not fit beside what other requests hold now is refused (503) before any of
    the body is read. Deadlines for the body are :mod:`kcache_server.bodies`'s.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > limit:
            raise TooLarge(f"body of {declared} bytes exceeds the limit of {limit}")
        share.admit(int(declared), "a request body")
    # BytesIO hands its buffer over without a copy (getvalue on an unshared buffer): a joined
    # list of chunks held the body twice at the end.
    buf = io.BytesIO()
    async for chunk in request.stream():
        if buf.tell() + len(chunk) > limit:
            raise TooLarge(f"body exceeds the limit of {limit} bytes")
        share.take(len(chunk), "a request body")
        buf.write(chunk)
    return buf.getvalue()
