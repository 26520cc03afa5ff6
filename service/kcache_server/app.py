"""The FastAPI application factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from kcache_schemas import PackLimits

from kcache_server import __version__, openapi
from kcache_server.auth import Authenticator, OpenServerNotice
from kcache_server.bodies import BodyDeadline
from kcache_server.handlers import install_error_handlers
from kcache_server.memory_budget import MemoryBudget
from kcache_server.metrics import instrument
from kcache_server.routes import (
    docs,
    entries,
    health,
    kernels,
    key_soundness,
    retention,
    runs,
    ui,
    workloads,
)
from kcache_server.settings import Settings
from kcache_server.storage import open_blob_store, open_index
from kcache_server.store import CacheStore
from kcache_server.store.gc import GcScheduler

log = logging.getLogger("kcache_server")


def build_store(settings: Settings) -> CacheStore:
    options = {"timeout_s": settings.backend_timeout_s}
    blob_opts = dict(options, endpoint_url=settings.s3_endpoint_url) if settings.resolved_blob_url.startswith("s3://") else {}
    index_opts = options if not settings.resolved_index_url.startswith("sqlite://") else {}
    return CacheStore(
        open_blob_store(settings.resolved_blob_url, **blob_opts),
        open_index(settings.resolved_index_url, **index_opts),
        PackLimits(max_unpacked_bytes=settings.max_unpacked_bytes),
        access_flush_s=settings.access_flush_s,
        budget=MemoryBudget(settings.memory_budget_bytes),
        retention=settings.retention_config,
        presign_reuse_s=settings.presign_reuse_s,
        workload_view_ttl_s=settings.workload_view_ttl_s,
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = build_store(settings)
        app.state.store = store
        store.gc.observers.append(app.state.metrics.record_gc)
        # The background GC runs where retention rules exist; every replica and worker runs
        # one, and the index lease lets one work at a time.
        scheduler = GcScheduler(store.gc).start() if settings.retention_config.active else None
        if scheduler is not None:
            store.on_pressure = scheduler.wake
        log.info(
            "kcache %s serving blobs=%s index=%s auth=%s",
            __version__, settings.resolved_blob_url, settings.resolved_index_url,
            "open (loopback only)" if app.state.auth.open else f"{len(settings.grants)} token(s)",
        )
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.close()
            store.close()

    app = FastAPI(
        title="kcache",
        version=__version__,
        summary="Distributed cache for compiled GPU kernels (Triton, PyTorch Inductor)",
        lifespan=lifespan,
        docs_url=None,  # kcache_server.routes.docs: the same page, with its assets from the package
        redoc_url=None,  # loads from a CDN only
    )
    app.state.settings = settings
    app.state.auth = Authenticator(settings.grants)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(kernels.router)
    app.include_router(entries.router)
    app.include_router(workloads.router)
    app.include_router(runs.router)
    app.include_router(retention.router)
    app.include_router(key_soundness.router)
    app.include_router(ui.router)
    app.include_router(docs.router)
    app.add_middleware(BodyDeadline, idle_s=settings.body_idle_timeout_s, total_s=settings.body_timeout_s)
    if app.state.auth.open:
        app.add_middleware(OpenServerNotice)
    instrument(app, settings.metrics_usage_ttl_s)  # /metrics, request metrics middleware (outside BodyDeadline), backend error counts
    openapi.install(app)  # error responses and path rules in /openapi.json
    return app
