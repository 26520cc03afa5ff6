"""Prometheus metrics for the service (``GET /metrics``), one registry per app.

* ``kcache_http_requests_total{route,method,status}`` and
  ``kcache_http_request_duration_seconds{route,method}``: by route *template*
  (``/v1/{namespace}/kernels/{key}``), so label sets stay bounded whatever clients ask for.
  ``status="499"``: the client closed the connection before its request body was complete
  (:mod:`kcache_server.bodies`); not an error of the service, and never a ``5xx``.
* ``kcache_lookups_total{layer,result}``: cache lookups, ``result`` ``hit`` or ``miss``. A kernel
  ``GET``/``HEAD`` that finds the pack is a hit, a 404 a miss; each key of a ``kernels:batch-get``
  counts once (found or missing, as the route counted them: ``record_batch_lookups``; a
  ``kernels:batch-urls`` counts the keys it signed a URL for and the missing ones); entry
  ``GET``/``HEAD`` count under their layer, and so do the entries an ``entries:batch-urls``
  signed a URL for or found missing. Manifest/file views (the dashboard) are not lookups.
* ``kcache_bytes_received_total{layer}``, ``kcache_bytes_sent_total{layer}``: body bytes; ``layer``
  is ``kernel``, an entry layer, or ``api`` for everything else.
* ``kcache_storage_bytes{namespace,kind}``, ``kcache_storage_entries{namespace,kind}``: from
  the store's usage at scrape time, cached for a few seconds. Per-run and per-workload kinds
  (``run/<id>``, ``workload/<name>``) are summed into ``run`` and ``workload``
  (:func:`kcache_server.kinds.family`).
* ``kcache_quarantined_total{layer}``: entries a client reported torch could not load, taken out
  of service by this process (``POST .../quarantine`` that created the report); the ones in force
  are ``kcache_storage_entries{kind="quarantine/<layer>"}``.
* ``kcache_unsound_keys_total{layer}``: keys a node's key-soundness canary found unsound (its own
  compile of the key gave other output than the stored entry: ``PUT .../unsound/{layer}/{key}``
  that recorded a new report); the entry is quarantined with it.
* ``kcache_backend_errors_total{backend}``: every ``BackendUnavailable`` that reached the API's
  error handler (answered 503), or a failed usage scrape.
* Retention: ``kcache_storage_budget_bytes{namespace,limit}`` (``soft``/``hard``, for namespaces
  that have one) and ``kcache_storage_oldest_item_age_seconds{namespace}`` (the least recently
  used item the namespace's last GC left) at scrape time, with the usage;
  ``kcache_gc_runs_total{trigger}``, ``kcache_gc_duration_seconds`` and
  ``kcache_gc_evicted_{bytes,entries}_total{namespace,reason}`` from the GC runs of this process
  (reason ``env``, ``ttl``, ``budget``; ``orphan`` with namespace ``*``).

The middleware is plain ASGI (no ``BaseHTTPMiddleware``), so streamed responses stay streamed.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from kcache_schemas import wire
from kcache_schemas.gc_models import REASON_ORPHAN, GcReport
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kcache_server import __version__
from kcache_server.storage import BackendUnavailable
from kcache_server.storage.base import KindUsage

log = logging.getLogger("kcache_server.metrics")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

# Label values for layers come from a fixed set: a client asking for /entries/<random>/x must not
# mint new time series.
KNOWN_LAYERS = frozenset(layer.value for layer in wire.CacheLayer)
KERNEL_LAYER = wire.CacheLayer.KERNEL.value
UNMATCHED = "unmatched"
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GC_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)


def layer_label(layer: str) -> str:
    return layer if layer in KNOWN_LAYERS else "other"


class StorageCollector(Collector):
    """Entries and bytes per namespace and kind, read from the index at scrape time (cached)."""

    def __init__(self, metrics: Metrics, store_getter: Callable[[], Any], ttl_s: float) -> None:
        self._metrics, self._store_getter, self.ttl_s = metrics, store_getter, ttl_s
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, dict[str, KindUsage]]] | None = None
        self._oldest: dict[str, float] = {}

    def usage(self) -> dict[str, dict[str, KindUsage]] | None:
        return self._read()[0]

    def _read(self) -> tuple[dict[str, dict[str, KindUsage]] | None, dict[str, float]]:
        """Usage, and each namespace's oldest item's last use (from its last GC report)."""
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.ttl_s:
                return self._cached[1], self._oldest
            store = self._store_getter()
            if store is None:
                return None, {}
            try:
                usage: dict[str, dict[str, KindUsage]] = store.records.usage()
                oldest: dict[str, float] = {}
                for ns in usage:
                    last = store.gc.last_report(ns)
                    if last is not None and last.oldest_used is not None:
                        oldest[ns] = last.oldest_used
            except BackendUnavailable as exc:
                self._metrics.backend_errors.labels(exc.backend).inc()
                log.warning("storage usage scrape failed: %s", exc)
                return (self._cached[1] if self._cached else None), self._oldest
            self._cached, self._oldest = (now, usage), oldest
            return usage, oldest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nbytes, entries, budget, oldest_age = self._families()
        usage, oldest = self._read()
        store = self._store_getter()
        for ns, kinds in sorted((usage or {}).items()):
            for kind, u in kinds.items():
                nbytes.add_metric([ns, kind], u.bytes)
                entries.add_metric([ns, kind], u.entries)
            policy = store.retention.policy(ns) if store is not None else None
            if policy is not None and policy.soft_limit_bytes is not None:
                budget.add_metric([ns, "soft"], policy.soft_limit_bytes)
            if policy is not None and policy.hard_limit_bytes is not None:
                budget.add_metric([ns, "hard"], policy.hard_limit_bytes)
            if ns in oldest:
                oldest_age.add_metric([ns], max(0.0, time.time() - oldest[ns]))
        yield nbytes
        yield entries
        yield budget
        yield oldest_age

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily("kcache_storage_bytes", "Bytes stored, per namespace and kind", labels=["namespace", "kind"]),
            GaugeMetricFamily("kcache_storage_entries", "Entries stored, per namespace and kind", labels=["namespace", "kind"]),
            GaugeMetricFamily("kcache_storage_budget_bytes", "A namespace's storage limit for kernels and entries (soft: GC target, hard: uploads refused)", labels=["namespace", "limit"]),
            GaugeMetricFamily("kcache_storage_oldest_item_age_seconds", "Time since the least recently used kernel or entry was used (as of the namespace's last GC)", labels=["namespace"]),
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Describing without collecting: registering must not touch the backend.
        yield from self._families()


class Metrics:
    """Every metric of one app, in its own registry (tests create many apps in one process)."""

    def __init__(self, store_getter: Callable[[], Any] = lambda: None, usage_ttl_s: float = 10.0) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        # Registered first, so a backend error met while scraping usage shows in the same scrape.
        self.storage = StorageCollector(self, store_getter, usage_ttl_s)
        r.register(self.storage)
        self.requests = Counter("kcache_http_requests", "HTTP requests by route template, method and status", ["route", "method", "status"], registry=r)
        self.duration = Histogram("kcache_http_request_duration_seconds", "HTTP request latency until the last body byte, by route template and method", ["route", "method"], buckets=_BUCKETS, registry=r)
        self.in_flight = Gauge("kcache_http_requests_in_flight", "HTTP requests being served", registry=r)
        self.lookups = Counter("kcache_lookups", "Cache lookups by layer and result (hit, miss)", ["layer", "result"], registry=r)
        self.bytes_received = Counter("kcache_bytes_received", "Request body bytes received, by layer (api: not a cache layer)", ["layer"], registry=r)
        self.bytes_sent = Counter("kcache_bytes_sent", "Response body bytes sent, by layer (api: not a cache layer)", ["layer"], registry=r)
        self.backend_errors = Counter("kcache_backend_errors", "Storage backend failures (BackendUnavailable), by backend", ["backend"], registry=r)
        self.run_reports = Counter("kcache_run_reports", "Client run-stats reports received", registry=r)
        self.quarantined = Counter("kcache_quarantined", "Entries reported unloadable and taken out of service, by layer", ["layer"], registry=r)
        self.unsound = Counter("kcache_unsound_keys", "Keys a node's canary found unsound (its compile differed from the stored entry), by layer", ["layer"], registry=r)
        self.gc_runs = Counter("kcache_gc_runs", "GC runs finished by this process, by trigger (schedule, pressure, api)", ["trigger"], registry=r)
        self.gc_duration = Histogram("kcache_gc_duration_seconds", "Duration of a GC run (one namespace, or the orphan sweep)", buckets=_GC_BUCKETS, registry=r)
        self.gc_evicted_bytes = Counter("kcache_gc_evicted_bytes", "Bytes the GC evicted, by namespace and reason (env, ttl, budget; orphan: blobs, namespace *)", ["namespace", "reason"], registry=r)
        self.gc_evicted_entries = Counter("kcache_gc_evicted_entries", "Kernels and entries the GC evicted, by namespace and reason (orphan: blobs)", ["namespace", "reason"], registry=r)
        build = Gauge("kcache_build_info", "kcache service version", ["version"], registry=r)
        build.labels(__version__).set(1)
        for result in ("hit", "miss"):  # so rates are defined from the first scrape
            self.lookups.labels(KERNEL_LAYER, result)
        for audited in (wire.CacheLayer.FX_GRAPH.value, KERNEL_LAYER):  # an alert on > 0 sees the 0
            self.unsound.labels(audited)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def record_gc(self, report: GcReport) -> None:
        self.gc_runs.labels(report.trigger).inc()
        self.gc_duration.observe(report.seconds)
        amounts = dict(report.evicted)
        if report.orphans.entries:
            amounts[REASON_ORPHAN] = report.orphans
        for reason, amount in amounts.items():
            self.gc_evicted_bytes.labels(report.namespace, reason).inc(amount.bytes)
            self.gc_evicted_entries.labels(report.namespace, reason).inc(amount.entries)


def _template(scope: Scope) -> str:
    route = scope.get("route")
    return str(getattr(route, "path", None) or UNMATCHED)


def _layer_of(template: str, scope: Scope) -> str:
    if "/kernels" in template:
        return KERNEL_LAYER
    if template.startswith(wire.ENTRY):
        return layer_label(str(scope.get("path_params", {}).get("layer", "")))
    return "api"


# A route that answers many lookups in one response (kernels:batch-get, entries:batch-urls) leaves
# its counts here, per layer, in the request's state: the middleware records them instead of
# re-reading the response.
BATCH_LOOKUPS = "kcache_batch_lookups"


def record_batch_lookups(request: Request, found: int, missing: int, layer: str = KERNEL_LAYER) -> None:
    counts: dict[str, tuple[int, int]] = getattr(request.state, BATCH_LOOKUPS, None) or {}
    before = counts.get(layer, (0, 0))
    counts[layer] = (before[0] + found, before[1] + missing)
    setattr(request.state, BATCH_LOOKUPS, counts)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        m = self.metrics
        start = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "received": 0, "sent": 0}

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = int(message["status"])
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                state["sent"] += len(body)
            await send(message)

        m.in_flight.inc()
        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            m.in_flight.dec()
            try:
                self._record(scope, state, time.perf_counter() - start)
            except Exception:  # metrics must never break a response
                log.exception("recording metrics failed")

    def _record(self, scope: Scope, state: dict[str, Any], elapsed: float) -> None:
        m = self.metrics
        template, method, status = _template(scope), str(scope.get("method", "")), int(state["status"])
        m.requests.labels(template, method, str(status)).inc()
        m.duration.labels(template, method).observe(elapsed)
        layer = _layer_of(template, scope)
        if state["received"]:
            m.bytes_received.labels(layer).inc(state["received"])
        if state["sent"]:
            m.bytes_sent.labels(layer).inc(state["sent"])
        if method in ("GET", "HEAD") and template in (wire.KERNEL, wire.ENTRY):
            if status in (200, 307):
                m.lookups.labels(layer, "hit").inc()
            elif status == 404:
                m.lookups.labels(layer, "miss").inc()
        elif template in (wire.KERNELS_BATCH_GET, wire.KERNELS_BATCH_URLS, wire.ENTRIES_BATCH_URLS) and status == 200:
            for batch_layer, (found, missing) in (scope.get("state", {}).get(BATCH_LOOKUPS) or {}).items():
                if found:
                    m.lookups.labels(batch_layer, "hit").inc(found)
                if missing:
                    m.lookups.labels(batch_layer, "miss").inc(missing)
        elif template == wire.RUN_STATS and method == "POST" and status in (200, 201):
            m.run_reports.inc()
        elif template == wire.ENTRY_QUARANTINE and method == "POST" and status == 201:
            m.quarantined.labels(layer).inc()
        elif template == wire.UNSOUND and method == "PUT" and status == 201:
            m.unsound.labels(layer_label(str(scope.get("path_params", {}).get("layer", "")))).inc()


def instrument(app: FastAPI, usage_ttl_s: float) -> Metrics:
    """Give ``app`` its metrics: the registry, the middleware, ``/metrics``, and a counting wrapper
    around the ``BackendUnavailable`` handler (call after the error handlers are installed).
    ``usage_ttl_s``: how long a scrape's storage usage is reused (``KCACHE_METRICS_USAGE_TTL_S``)."""
    metrics = Metrics(lambda: getattr(app.state, "store", None), usage_ttl_s)
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    original = app.exception_handlers.get(BackendUnavailable)
    if original is not None:

        async def counting_handler(request: Request, exc: Exception) -> Response:
            metrics.backend_errors.labels(getattr(exc, "backend", "unknown")).inc()
            result = original(request, exc)
            return await result if inspect.isawaitable(result) else result

        app.add_exception_handler(BackendUnavailable, counting_handler)
    app.include_router(router)
    return metrics


router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics_endpoint(request: Request) -> Response:
    metrics: Metrics = request.app.state.metrics
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
