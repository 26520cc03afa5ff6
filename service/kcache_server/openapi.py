"""The OpenAPI document says what the service really answers: its error responses and its path
rules, which FastAPI cannot see (errors come from one handler, path parameters are validated by
the schemas' functions so a bad one is a ``400 invalid_key``, not FastAPI's ``422``).

Added to FastAPI's document, by rule:

* every error response is :class:`kcache_schemas.ErrorBody` (FastAPI's ``422`` included: the
  handler answers it in that shape too);
* ``/v1`` operations: ``401`` (with ``WWW-Authenticate``) and ``503`` (backend unavailable, or the
  replica's memory budget spent; with ``Retry-After``); with a namespace also ``403``; with path
  parameters or a body ``400``; on one item (GET, HEAD, DELETE) ``404``; kernel and entry
  uploads ``409`` (write-once) and ``507`` (the namespace's hard storage limit), a GC run ``409``
  (another holds the lease); operations with a body ``408`` (body deadline); the routes with
  size limits ``413``;
* each path parameter's rule as a ``pattern`` (the validators' own regular expressions);
* the request bodies that routes read themselves (to bound them in memory, FastAPI never sees
  them): a pack, an entry's bytes, a run's statistics (:class:`RunStatsReport`), an unsound-key
  report (:class:`UnsoundReport`), each required;
* optional headers as what they are on the wire: absent, or a value (FastAPI writes ``null``
  into an optional header's schema, and no header value means "null").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from kcache_schemas import ErrorBody, wire
from kcache_schemas.keys import (
    ENTRY_KEY_PATTERN,
    KERNEL_KEY_PATTERN,
    LAYER_PATTERN,
    NAMESPACE_PATTERN,
    RUN_ID_PATTERN,
    WORKLOAD_NAME_PATTERN,
)
from kcache_schemas.models import FILENAME_PATTERN
from kcache_schemas.pack import MEDIA_TYPE
from kcache_schemas.stats_document import RunStatsReport
from kcache_schemas.unsound_reports import UnsoundReport

_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_DESCRIPTIONS = {
    400: "Malformed key, namespace, layer, file name, pack or request",
    401: "Missing or unknown bearer token",
    403: "The token lacks the scope on this namespace",
    404: "Not stored",
    408: "The request body did not arrive in time (the connection is closed)",
    409: "Write-once: different content is stored under this key",
    413: "Too large: the body, or what the pack unpacks to",
    422: "The body or a query parameter fails its schema",
    503: "A storage backend is unavailable, or the replica's memory budget is spent: retry later",
    507: "The namespace is at its hard storage limit (KCACHE_RETENTION): retry once the GC made room",
}
# Where a status means something else than its usual description.
_DESCRIPTION_FOR = {(409, "post", wire.GC): "Another GC is running (one at a time across replicas): retry later"}
_HEADERS = {
    401: {"WWW-Authenticate": {"description": 'Bearer realm="kcache"', "schema": {"type": "string"}}},
    408: {"Connection": {"description": "close", "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
}
_SIZE_LIMITED = {("put", wire.KERNEL), ("put", wire.ENTRY), ("post", wire.RUN_STATS), ("get", wire.KERNEL_FILE), ("put", wire.UNSOUND)}
_WRITE_ONCE = {("put", wire.KERNEL), ("put", wire.ENTRY)}
_STORAGE_LIMITED = _WRITE_ONCE  # uploads count against the namespace's storage limits
_ONE_ITEM = ("{key}", "{name}", "{run_id}")
# A GC run names an environment (``env``) that may not exist in the namespace; a pin (without
# ``?ahead=true``) a workload that may have no published run.
_NOT_FOUND_TOO = {("post", wire.GC), ("put", wire.PIN)}
_BINARY = {"type": "string", "format": "binary"}
# Bodies the routes read themselves: (method, path) -> (media type, schema).
_OWN_BODIES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("put", wire.KERNEL): (MEDIA_TYPE, _BINARY),
    ("put", wire.ENTRY): ("application/octet-stream", _BINARY),
    ("post", wire.RUN_STATS): ("application/json", {"$ref": "#/components/schemas/RunStatsReport"}),
    ("put", wire.UNSOUND): ("application/json", {"$ref": "#/components/schemas/UnsoundReport"}),
}


def _param_pattern(path: str, name: str) -> str | None:
    if name == "key":
        return ENTRY_KEY_PATTERN if path.startswith((wire.ENTRIES, wire.UNSOUND_LIST)) else KERNEL_KEY_PATTERN
    return {
        "namespace": NAMESPACE_PATTERN,
        "layer": LAYER_PATTERN,
        "filename": FILENAME_PATTERN,
        "name": WORKLOAD_NAME_PATTERN if path.startswith((wire.WORKLOADS, wire.PINS)) else None,
        "run_id": RUN_ID_PATTERN,
    }.get(name)


def error_statuses(path: str, method: str, operation: dict[str, Any]) -> set[int]:
    """The error statuses one operation can answer, by the rules in the module docstring."""
    if not path.startswith(wire.API + "/"):
        return set()
    has_params = any(p.get("in") == "path" for p in operation.get("parameters", ()))
    has_body = "requestBody" in operation or method in ("put", "post")
    statuses = {401, 503}
    if "{namespace}" in path:
        statuses.add(403)
    if has_params or has_body:
        statuses.add(400)
    if (method in ("get", "head", "delete") and any(p in path for p in _ONE_ITEM)) or (method, path) in _NOT_FOUND_TOO:
        statuses.add(404)
    if (method, path) in _WRITE_ONCE or (method, path) == ("post", wire.GC):
        statuses.add(409)
    if (method, path) in _STORAGE_LIMITED:
        statuses.add(507)
    if has_body:
        statuses.add(408)
    if (method, path) in _SIZE_LIMITED:
        statuses.add(413)
    if "422" in operation.get("responses", {}):
        statuses.add(422)
    return statuses


def document(schema: dict[str, Any]) -> dict[str, Any]:
    """Add error responses and path rules to a FastAPI OpenAPI document (in place)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorBody, RunStatsReport, UnsoundReport):
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if (method, path) in _OWN_BODIES:
                media, body_schema = _OWN_BODIES[(method, path)]
                operation["requestBody"] = {"required": True, "content": {media: {"schema": body_schema}}}
            responses = operation.setdefault("responses", {})
            for status in sorted(error_statuses(path, method, operation)):
                response: dict[str, Any] = {
                    "description": _DESCRIPTION_FOR.get((status, method, path), _DESCRIPTIONS[status]),
                    "content": {"application/json": {"schema": _ERROR_REF}},
                }
                if status in _HEADERS:
                    response["headers"] = _HEADERS[status]
                responses[str(status)] = response
            for param in operation.get("parameters", ()):
                pattern = _param_pattern(path, param["name"]) if param.get("in") == "path" else None
                if pattern is not None:
                    param.setdefault("schema", {})["pattern"] = pattern
                if param.get("in") == "header":
                    _not_null(param.get("schema", {}))
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    return schema


def _not_null(schema: dict[str, Any]) -> None:
    """``anyOf: [X, {type: null}]`` becomes X (in place)."""
    options = [o for o in schema.get("anyOf", ()) if o.get("type") != "null"]
    if "anyOf" in schema and len(options) == 1:
        del schema["anyOf"]
        schema.update(options[0])


def install(app: FastAPI) -> None:
    """Serve the documented schema from ``/openapi.json`` (built once, on first request)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
