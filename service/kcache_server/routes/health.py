"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from kcache_server import __version__
from kcache_server.deps import StoreDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers (no backend checks)")
def healthz() -> dict[str, str]:
    return {"status": "ok", "version": __version__}


@router.get("/readyz", summary="Readiness: both storage backends answer")
async def readyz(store: StoreDep) -> JSONResponse:
    checks = await run_in_threadpool(store.readiness)
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable", "checks": checks}, status_code=200 if ready else 503)
