"""HTTP and OpenAPI conformance (issue #17): ``Allow`` on 405, ``Content-Type`` on HEAD, and an
OpenAPI document that names the error responses and the path rules the service really applies.
(``WWW-Authenticate`` on 401 is in tests/test_auth.py.)"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kcache_schemas import (
    InvalidKeyError,
    normalize_entry_key,
    normalize_kernel_key,
    validate_layer,
    validate_namespace,
    validate_run_id,
    validate_workload_name,
)
from kcache_schemas.models import validate_filename

from kcache_testkit.kernels import Kernel

pytest.register_assert_rewrite("api_helpers")



pytest_plugins = ["api_helpers"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/v1/{ns}/kernels/{key}", "DELETE, GET, HEAD, PUT"),
        ("PATCH", "/v1/{ns}/entries/fx-graph/k1", "DELETE, GET, HEAD, PUT"),
        ("PUT", "/v1/{ns}/kernels/{key}/manifest", "GET, HEAD"),
        ("GET", "/v1/{ns}/kernels:missing", "POST"),
        ("DELETE", "/healthz", "GET, HEAD"),
    ],
)
def test_405_names_every_method_of_the_path(client: httpx.Client, ns: str, kernel: Kernel, method: str, path: str, allow: str) -> None:
    """Starlette named only the methods of the first route that matched (PUT for a kernel)."""
    resp = client.request(method, path.format(ns=ns, key=kernel.key))
    assert resp.status_code == 405
    assert resp.headers["allow"] == allow
    assert resp.json()["error"]["code"] == "invalid_request"


def test_head_answers_carry_the_content_type(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    assert client.put(f"/v1/{ns}/entries/fx-graph/k1", content=b"entry").status_code == 201
    head = client.head(f"/v1/{ns}/entries/fx-graph/k1")
    assert head.status_code == 200 and head.headers["content-type"] == "application/octet-stream"
    assert head.headers["content-length"] == "5"
    assert client.put(f"/v1/{ns}/kernels/{kernel.key}", content=kernel.pack).status_code == 201
    head = client.head(f"/v1/{ns}/kernels/{kernel.key}")
    assert head.headers["content-type"] == "application/vnd.kcache.pack.v1"


def _spec(client: httpx.Client) -> dict[str, Any]:
    resp = client.get("/openapi.json")
    assert resp.status_code == 200
    return resp.json()  # type: ignore[no-any-return]


def test_openapi_documents_the_error_responses(client: httpx.Client) -> None:
    spec = _spec(client)
    assert "ErrorBody" in spec["components"]["schemas"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]  # 422 is an ErrorBody too
    ops = {(m.upper(), p): op for p, methods in spec["paths"].items() for m, op in methods.items()}
    for (method, path), op in ops.items():
        if not path.startswith("/v1/"):
            continue
        statuses = {int(s) for s in op["responses"] if s.startswith(("4", "5"))}
        assert {401, 503} <= statuses, (method, path)
        for status in statuses:
            body = op["responses"][str(status)]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
        assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
        assert "Retry-After" in op["responses"]["503"]["headers"]
        if "{namespace}" in path:
            assert {400, 403} <= statuses, (method, path)
        if method in ("PUT", "POST"):
            assert 408 in statuses, (method, path)
    assert {400, 401, 403, 408, 409, 413, 422, 503} <= {int(s) for s in ops[("PUT", "/v1/{namespace}/kernels/{key}")]["responses"]}
    assert {404, 413} <= {int(s) for s in ops[("GET", "/v1/{namespace}/kernels/{key}/files/{filename}")]["responses"]}
    assert 404 in {int(s) for s in ops[("HEAD", "/v1/{namespace}/entries/{layer}/{key}")]["responses"]}
    assert 507 in {int(s) for s in ops[("PUT", "/v1/{namespace}/entries/{layer}/{key}")]["responses"]}  # storage limit
    gc = ops[("POST", "/v1/{namespace}/gc")]["responses"]
    assert "another gc" in gc["409"]["description"].lower() and "507" not in gc


_VALIDATORS: dict[str, Callable[[str], str]] = {
    "namespace": validate_namespace,
    "kernel key": normalize_kernel_key,
    "layer": validate_layer,
    "entry key": normalize_entry_key,
    "filename": validate_filename,
    "workload name": validate_workload_name,
    "run_id": validate_run_id,
}


def _samples(rng: random.Random, kernel: Kernel) -> list[str]:
    alphabet = string.ascii_letters + string.digits + "_.:=+-/ \n%"
    out = ["", "a", "A", "_", "-x", ".x", "x\n", "a" * 63, "a" * 64, "a" * 200, "a" * 201, "a" * 512, "a" * 513,
           kernel.key, kernel.key[:-1] + "B", kernel.hex_key, kernel.hex_key.upper(), kernel.hex_key + "0",
           "__grp__x.json", "__grp__x.ptx", "__x", "x.ptx", "fx-graph", "FX", "pt2:fx-graph-v1::abc:c1", "gh:12+retry"]
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80))) for _ in range(400)]
    return out


def test_openapi_path_patterns_are_the_validators_rules(client: httpx.Client, kernel: Kernel) -> None:
    """Each documented pattern accepts exactly what the service's validator accepts (on edge cases
    and random strings); a client generating from the schema meets no surprise 400."""
    spec = _spec(client)
    patterns: dict[str, str] = {}
    for path, methods in spec["paths"].items():
        for op in methods.values():
            for param in op.get("parameters", ()):
                if param["in"] == "path":
                    name = param["name"]
                    if name == "key":
                        name = "entry key" if "/entries/" in path else "kernel key"
                    elif name == "name":
                        name = "workload name"
                    patterns.setdefault(name, param["schema"]["pattern"])
    assert set(patterns) == set(_VALIDATORS)
    samples = _samples(random.Random(17), kernel)
    for name, pattern in patterns.items():
        regex = re.compile(pattern)
        for s in samples:
            try:
                _VALIDATORS[name](s)
                valid = True
            except (InvalidKeyError, ValueError):
                valid = False
            assert bool(regex.fullmatch(s)) == valid, (name, s)


def test_what_schemathesis_found_now_agrees_with_the_document(client: httpx.Client, ns: str, kernel: Kernel) -> None:
    """Issue #31's drifts between the OpenAPI document and the service, one by one (the fuzzer,
    tests/test_schemathesis.py, finds them at random; these are the cases it found)."""
    from kcache_schemas import wire

    spec = _spec(client)
    ops = {(m.upper(), p): op for p, methods in spec["paths"].items() for m, op in methods.items()}
    # HEAD answers the GET's content type, and the document says so (it said JSON).
    assert list(ops[("HEAD", wire.ENTRY)]["responses"]["200"]["content"]) == ["application/octet-stream"]
    assert list(ops[("HEAD", wire.KERNEL)]["responses"]["200"]["content"]) == ["application/vnd.kcache.pack.v1"]
    # An identical re-upload (a repeated pin, manifest, report) answers 200: documented now.
    for op in (("PUT", wire.KERNEL), ("PUT", wire.ENTRY), ("PUT", wire.PIN), ("PUT", wire.WORKLOAD), ("POST", wire.RUN_STATS)):
        assert "200" in ops[op]["responses"], op
    entry = f"/v1/{ns}/entries/fx-graph/again"
    assert [client.put(entry, content=b"same").status_code for _ in range(2)] == [201, 200]
    # ``true`` is no number of seconds (it was taken as 1 s).
    refused = client.post(f"/v1/{ns}/gc", json={"older_than_s": True, "dry_run": True})
    assert refused.status_code == 422 and "older_than_s" in refused.text
    assert client.post(f"/v1/{ns}/gc", json={"older_than_s": 3600, "max_bytes": 5.0, "dry_run": True}).status_code == 200
    # An optional header is absent or a number: never ``null`` (no header value means null).
    header = next(p for p in ops[("PUT", wire.ENTRY)]["parameters"] if p["name"] == "x-kcache-compile-time")
    assert header["schema"]["type"] == "number" and "anyOf" not in header["schema"]
    # A run report's body is documented and required: an empty one is refused, as it was.
    body = ops[("POST", wire.RUN_STATS)]["requestBody"]
    assert body["required"] and body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RunStatsReport"}
    assert client.post(f"/v1/{ns}/runs/r1/stats", content=b"").status_code == 422
    # A GC's env selector has a documented form: "0" is neither form (400, as before), and an
    # environment id no run has is a 404 (documented).
    env = spec["components"]["schemas"]["GcRequest"]["properties"]["env"]["pattern"]
    assert not re.search(env, "0") and re.search(env, "torch=2.13.0,arch=sm_90") and re.search(env, "0123456789abcdef")
    assert client.post(f"/v1/{ns}/gc", json={"env": "0", "dry_run": True}).status_code == 400
    assert client.post(f"/v1/{ns}/gc", json={"env": "0123456789abcdef", "dry_run": True}).status_code == 404
    assert "404" in ops[("POST", wire.GC)]["responses"]
