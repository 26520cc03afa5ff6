"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from kcache_server import __version__
from kcache_server.deps import StoreDep
from kcache_server.storage import BackendUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers (no backend checks)")
def healthz() -> dict[str, str]:
    return {"status": "ok", "version": __version__}


@router.get("/readyz", summary="Readiness: both storage backends answer")
async def readyz(store: StoreDep) -> JSONResponse:
    checks: dict[str, str] = {}
    for name, backend in (("blobs", store.blobs), ("index", store.index)):
        try:
            await run_in_threadpool(backend.ping)
            checks[name] = "ok"
        except BackendUnavailable as exc:
            checks[name] = str(exc)
        except Exception as exc:  # a backend bug must still read as "not ready", not a 500
            checks[name] = f"{type(exc).__name__}: {exc}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable", "checks": checks}, status_code=200 if ready else 503)
