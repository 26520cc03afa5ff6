"""Bearer tokens with read / write / admin scopes per namespace, and the loopback-only open mode."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kcache_server.settings import Settings
from pydantic import ValidationError

from kcache_testkit.kernels import Kernel
from kcache_testkit.pace import HANG_S, bound

pytest.register_assert_rewrite("api_helpers")

from api_helpers import (  # noqa: E402
    ADMIN_TOKEN,
    READ_TOKEN,
    TEAM_A_TOKEN,
    WRITE_TOKEN,
    assert_error,
    inproc_client,
    make_settings,
)

from kcache_testkit.service import ServerProcess, clean_env, kcache_cmd  # noqa: E402

pytest_plugins = ["api_helpers"]

GRANTS = [
    {"token": READ_TOKEN, "name": "reader", "scopes": ["read"]},
    {"token": WRITE_TOKEN, "name": "writer", "scopes": ["write"]},
    {"token": ADMIN_TOKEN, "name": "ops", "scopes": ["admin"]},
    {"token": TEAM_A_TOKEN, "name": "team-a-ci", "namespaces": ["team-a"], "scopes": ["write"]},
]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=["tokens", "tokens_file"])
def auth_client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    if request.param == "tokens":
        settings = make_settings(tmp_path / "data", tokens=json.dumps(GRANTS))
    else:
        tokens_file = tmp_path / "tokens.json"
        tokens_file.write_text(json.dumps(GRANTS))
        settings = make_settings(tmp_path / "data", tokens_file=tokens_file)
    assert len(settings.grants) == len(GRANTS)
    with inproc_client(settings) as c:
        yield c


def _put(c: httpx.Client, ns: str, k: Kernel, token: str | None) -> httpx.Response:
    headers = _bearer(token) if token else {}
    return c.put(f"/v1/{ns}/kernels/{k.key}", content=k.pack, headers=headers)


def test_no_token_is_401(auth_client: httpx.Client, kernel: Kernel) -> None:
    url = f"/v1/default/kernels/{kernel.key}"
    assert_error(_put(auth_client, "default", kernel, None), 401, "unauthorized", "bearer token")
    assert_error(auth_client.get(url), 401, "unauthorized", "bearer token")
    assert auth_client.head(url).status_code == 401
    assert_error(auth_client.get("/v1/default/kernels"), 401, "unauthorized")
    assert_error(auth_client.put("/v1/default/entries/fx-graph/k1", content=b"x"), 401, "unauthorized")
    assert_error(auth_client.get(url, headers={"Authorization": f"Basic {WRITE_TOKEN}"}), 401, "unauthorized")
    # RFC 9110 §11.6.1: a 401 names the scheme it wants
    assert auth_client.get(url).headers["www-authenticate"] == 'Bearer realm="kcache"'
    assert auth_client.head(url).headers["www-authenticate"] == 'Bearer realm="kcache"'
    # Liveness and readiness stay open for load balancers and probes.
    assert auth_client.get("/healthz").status_code == 200
    assert auth_client.get("/readyz").status_code == 200
    # Nothing was stored by the refused PUT.
    assert auth_client.get("/v1/default/kernels", headers=_bearer(READ_TOKEN)).json()["items"] == []


def test_wrong_token_is_401(auth_client: httpx.Client, kernel: Kernel) -> None:
    for wrong in ("x" * 32, WRITE_TOKEN + "x", WRITE_TOKEN[:-1], WRITE_TOKEN.upper()):
        resp = _put(auth_client, "default", kernel, wrong)
        assert_error(resp, 401, "unauthorized", "unknown bearer token")
        assert resp.headers["www-authenticate"].startswith("Bearer ")
    assert auth_client.head(f"/v1/default/kernels/{kernel.key}", headers=_bearer(READ_TOKEN)).status_code == 404


def test_read_token_cannot_put(auth_client: httpx.Client, kernel: Kernel) -> None:
    assert_error(_put(auth_client, "default", kernel, READ_TOKEN), 403, "forbidden", "reader", "write", "default")
    entry = auth_client.put("/v1/default/entries/fx-graph/k1", content=b"x", headers=_bearer(READ_TOKEN))
    assert_error(entry, 403, "forbidden", "write")
    listing = auth_client.get("/v1/default/kernels", headers=_bearer(READ_TOKEN))
    assert listing.status_code == 200 and listing.json()["items"] == []


def test_write_token_can_put_and_get(auth_client: httpx.Client, kernel: Kernel) -> None:
    assert _put(auth_client, "default", kernel, WRITE_TOKEN).status_code == 201
    url = f"/v1/default/kernels/{kernel.key}"
    for token in (WRITE_TOKEN, READ_TOKEN, ADMIN_TOKEN):
        got = auth_client.get(url, headers=_bearer(token))
        assert got.status_code == 200 and got.content == kernel.pack
    assert auth_client.put(
        "/v1/default/entries/fx-graph/k1", content=b"x", headers=_bearer(WRITE_TOKEN)
    ).status_code == 201


def test_namespace_scoped_token(auth_client: httpx.Client, kernel: Kernel) -> None:
    assert _put(auth_client, "team-a", kernel, TEAM_A_TOKEN).status_code == 201
    assert auth_client.get(f"/v1/team-a/kernels/{kernel.key}", headers=_bearer(TEAM_A_TOKEN)).status_code == 200
    assert_error(_put(auth_client, "team-b", kernel, TEAM_A_TOKEN), 403, "forbidden", "team-a-ci", "team-b")
    assert_error(
        auth_client.get(f"/v1/team-b/kernels/{kernel.key}", headers=_bearer(TEAM_A_TOKEN)),
        403, "forbidden", "team-b",
    )
    assert_error(auth_client.get("/v1/team-b/kernels", headers=_bearer(TEAM_A_TOKEN)), 403, "forbidden")
    # A '*' token sees team-a's kernel, and team-b stayed empty.
    assert auth_client.get(f"/v1/team-a/kernels/{kernel.key}", headers=_bearer(READ_TOKEN)).status_code == 200
    assert auth_client.get("/v1/team-b/kernels", headers=_bearer(READ_TOKEN)).json()["items"] == []


def test_only_admin_can_delete(auth_client: httpx.Client, kernel: Kernel) -> None:
    url = f"/v1/default/kernels/{kernel.key}"
    assert _put(auth_client, "default", kernel, WRITE_TOKEN).status_code == 201
    assert_error(auth_client.delete(url, headers=_bearer(WRITE_TOKEN)), 403, "forbidden", "admin")
    assert_error(auth_client.delete(url, headers=_bearer(READ_TOKEN)), 403, "forbidden", "admin")
    assert_error(auth_client.delete(url, headers=_bearer(TEAM_A_TOKEN)), 403, "forbidden")
    assert_error(auth_client.delete(url), 401, "unauthorized")
    assert auth_client.head(url, headers=_bearer(READ_TOKEN)).status_code == 200
    assert auth_client.delete(url, headers=_bearer(ADMIN_TOKEN)).status_code == 204
    assert auth_client.head(url, headers=_bearer(READ_TOKEN)).status_code == 404

    entry = "/v1/default/entries/fx-graph/k1"
    assert auth_client.put(entry, content=b"x", headers=_bearer(WRITE_TOKEN)).status_code == 201
    assert_error(auth_client.delete(entry, headers=_bearer(WRITE_TOKEN)), 403, "forbidden", "admin")
    assert auth_client.delete(entry, headers=_bearer(ADMIN_TOKEN)).status_code == 204

    # Quarantine: reporting takes write scope (a reader cannot take entries out of service),
    # reading the report read scope, lifting it admin.
    q = "/v1/default/entries/fx-graph/k2/quarantine"
    assert_error(auth_client.post(q, json={"reason": "x"}, headers=_bearer(READ_TOKEN)), 403, "forbidden")
    assert_error(auth_client.post(q, json={"reason": "x"}), 401, "unauthorized")
    assert auth_client.post(q, json={"reason": "x"}, headers=_bearer(WRITE_TOKEN)).status_code == 201
    assert auth_client.get(q, headers=_bearer(READ_TOKEN)).json()["reason"] == "x"
    assert_error(auth_client.delete(q, headers=_bearer(WRITE_TOKEN)), 403, "forbidden", "admin")
    assert auth_client.delete(q, headers=_bearer(ADMIN_TOKEN)).status_code == 204


# ---- token hygiene at load --------------------------------------------------------------------


@pytest.mark.parametrize("weak", ["changeme", "changethis", "password", "short-token", "", "x" * 15])
def test_weak_tokens_refused_at_load(weak: str, tmp_path: Path) -> None:
    grants = json.dumps([{"token": weak, "scopes": ["write"]}])
    with pytest.raises(ValidationError, match="at least 16 characters"):
        make_settings(tmp_path, tokens=grants)
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(grants)
    with pytest.raises(ValidationError, match="at least 16 characters"):
        make_settings(tmp_path, tokens_file=tokens_file)


@pytest.mark.parametrize(
    "grant",
    [
        {"token": WRITE_TOKEN, "scopes": []},
        {"token": WRITE_TOKEN, "scopes": ["root"]},
        {"token": WRITE_TOKEN, "scopes": ["read"], "namespaces": []},
        {"scopes": ["read"]},
    ],
)
def test_malformed_grants_refused_at_load(grant: dict[str, object], tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        make_settings(tmp_path, tokens=json.dumps([grant]))


def test_tokens_never_echoed(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, tokens=json.dumps(GRANTS))
    assert WRITE_TOKEN not in repr(settings.grants)


# ---- open mode is loopback-only ----------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "kcache.example.com"])
def test_open_server_refuses_non_loopback(host: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        make_settings(tmp_path, host=host).check_bind()
    msg = str(exc.value.code)
    assert f"refusing to bind {host} without tokens" in msg
    assert "KCACHE_TOKENS_FILE" in msg


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_tokens_allow_any_bind(host: str, tmp_path: Path) -> None:
    make_settings(tmp_path, host=host, tokens=json.dumps(GRANTS)).check_bind()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_open_server_on_loopback_is_fine(host: str, tmp_path: Path) -> None:
    make_settings(tmp_path, host=host).check_bind()


@pytest.mark.slow
def test_kcache_serve_refuses_open_non_loopback_bind(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = subprocess.run(
        [*kcache_cmd(), "serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=HANG_S, env=clean_env(),
    )
    assert proc.returncode != 0
    assert "refusing to bind 0.0.0.0 without tokens" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < bound(0, 40_000)  # ~20 s idle
    assert not (tmp_path / "d").exists()  # refused before touching storage


@pytest.mark.slow
def test_kcache_serve_with_tokens_file_enforces_auth(tmp_path: Path, kernel: Kernel) -> None:
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps(GRANTS))
    server = ServerProcess(tmp_path / "data", tmp_path, env=clean_env(KCACHE_TOKENS_FILE=str(tokens_file)))
    server.start()
    try:
        with server.client() as c:
            url = f"/v1/default/kernels/{kernel.key}"
            assert_error(c.put(url, content=kernel.pack), 401, "unauthorized")
            assert_error(c.put(url, content=kernel.pack, headers=_bearer(READ_TOKEN)), 403, "forbidden")
            assert c.put(url, content=kernel.pack, headers=_bearer(WRITE_TOKEN)).status_code == 201
            assert c.get(url, headers=_bearer(READ_TOKEN)).content == kernel.pack
    finally:
        server.stop()
    assert WRITE_TOKEN not in server.stderr()
    assert "4 token(s)" in server.stderr()


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KCACHE_TOKENS", json.dumps(GRANTS[:1]))
    monkeypatch.setenv("KCACHE_HOST", "0.0.0.0")
    monkeypatch.setenv("KCACHE_DATA_DIR", str(tmp_path))
    settings = Settings()
    assert [g.name for g in settings.grants] == ["reader"]
    settings.check_bind()
    monkeypatch.setenv("KCACHE_TOKENS", json.dumps([{"token": "changeme", "scopes": ["read"]}]))
    with pytest.raises(ValidationError):
        Settings()


def test_an_open_server_says_on_every_answer_that_it_checks_no_token(tmp_path: Path, auth_client: httpx.Client) -> None:
    """Issue #32: a wrong token on an open server was accepted silently. The server still serves
    it (open is open), and every answer says ``X-Kcache-Auth: open`` so the client can tell its
    user; a server with tokens never says it."""
    with inproc_client(make_settings(tmp_path / "open")) as open_client:
        assert open_client.put("/v1/default/entries/fx-graph/k1", content=b"x", headers=_bearer("x" * 32)).status_code == 201
        answers = [
            open_client.get("/v1/default/entries/fx-graph/k1", headers=_bearer("x" * 32)),  # streamed body
            open_client.get("/v1/default/entries/fx-graph"),
            open_client.get("/v1/default/entries/fx-graph/nope"),  # an error
            open_client.get("/healthz"),
        ]
        assert [a.headers.get("x-kcache-auth") for a in answers] == ["open"] * 4
        assert answers[0].content == b"x"
    for response in (auth_client.get("/v1/default/kernels", headers=_bearer(READ_TOKEN)), auth_client.get("/v1/default/kernels"), auth_client.get("/healthz")):
        assert "x-kcache-auth" not in response.headers


def test_listing_entries_needs_read_scope_on_the_namespace(auth_client: httpx.Client) -> None:
    assert auth_client.put("/v1/team-a/entries/fx-graph/k1", content=b"x", headers=_bearer(TEAM_A_TOKEN)).status_code == 201
    assert_error(auth_client.get("/v1/team-a/entries/fx-graph"), 401, "unauthorized")
    assert_error(auth_client.get("/v1/team-b/entries/fx-graph", headers=_bearer(TEAM_A_TOKEN)), 403, "forbidden", "team-b")
    listing = auth_client.get("/v1/team-a/entries/fx-graph", headers=_bearer(TEAM_A_TOKEN))
    assert listing.status_code == 200 and [e["key"] for e in listing.json()["items"]] == ["k1"]
