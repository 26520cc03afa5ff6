"""Key soundness without torch: the canary's setting and normalisation, the suspects of an unsound
report, identity markers, and the service's side (unsound reports, their metric, kernel
quarantine, the entry listing, purge by recorded key part, ``kcache purge``).

The end-to-end stories with real Inductor and Triton jobs are tests/test_canary.py's."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kcache.cli.commands import main as kcache_main
from kcache.config import ClientConfig
from kcache.exceptions import ConfigError
from kcache.layers.key_canary import normalise
from kcache_schemas.key_diff import (
    Component,
    KeyComponents,
    components_key,
    components_key_of_marker,
    identity,
    identity_marker,
    identity_prefix,
)
from kcache_schemas.models import EnvFingerprint
from kcache_schemas.units import parse_fraction
from kcache_schemas.unsound_reports import UnsoundReport, suspects

pytest.register_assert_rewrite("api_helpers")

from api_helpers import (  # noqa: E402
    ADMIN_TOKEN,
    READ_TOKEN,
    WRITE_TOKEN,
    assert_error,
    inproc_client,
    make_settings,
)

from kcache_testkit.kernels import Kernel  # noqa: E402
from kcache_testkit.pace import HANG_S  # noqa: E402

pytest_plugins = ["api_helpers", "live"]

FX = "fx-graph"
GRAPH = "fabcdefghijklmnopqrstuvwxyz234567abcdefghijklmnopqrs"
STORED = f"pt2:fx-graph-v1::{GRAPH}:c1"
ENV = EnvFingerprint(torch="2.13.0", triton="3.9.0")


def part(value: str) -> Component:
    return Component(hash=hashlib.sha256(value.encode()).hexdigest()[:32], value=value)


def parts(key: str = GRAPH, *, layer: str = FX, env: EnvFingerprint | None = ENV, run: str | None = None,
          context: dict[str, str] | None = None, **components: str) -> KeyComponents:
    """Recorded parts; ``inductor_config__max_autotune="True"`` is ``inductor_config[max_autotune]``."""
    named = {"gm": "def forward(x): ...", "example_inputs": "[f32[16, 16]]", **components}
    return KeyComponents(layer=layer, key=key, components={_name(n): part(v) for n, v in named.items()},
                         context={n: part(v) for n, v in (context or {}).items()}, environment=env, run_id=run)


def _name(kwarg: str) -> str:
    head, sep, rest = kwarg.partition("__")
    return f"{head}[{rest}]" if sep else head


# ---- the setting, normalisation, suspects, identity ------------------------------------------------


@pytest.mark.parametrize(("text", "share"), [("0", 0.0), ("0.01", 0.01), ("1%", 0.01), ("0.5 %", 0.005), ("1", 1.0), ("100%", 1.0), (".25", 0.25)])
def test_canary_share_reads_fractions_and_percentages(text: str, share: float) -> None:
    assert parse_fraction(text) == pytest.approx(share)
    assert ClientConfig.from_env(canary=text).canary == pytest.approx(share)


@pytest.mark.parametrize(("text", "says"), [("5", "write 5% for 5 percent"), ("-0.1", "must not be negative"), ("lots", "not a fraction"),
                                            ("101%", "from 0 to 1"), ("nan", "not a fraction")])
def test_a_canary_share_that_does_not_parse_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, text: str, says: str) -> None:
    monkeypatch.setenv("KCACHE_CANARY", text)
    with pytest.raises(ConfigError) as info:
        ClientConfig.from_env()
    assert f"KCACHE_CANARY={text!r}" in str(info.value) and says in str(info.value)


def test_the_canary_is_off_by_default() -> None:
    assert ClientConfig().canary == 0.0


def test_normalise_cuts_paths_and_the_aot_id_and_nothing_else() -> None:
    a = '# AOT ID: [\'0_inference\']\n#loc = loc("/home/a/job.py":5:1)\n.file 1 "/tmp/torchinductor_a/xy/cxyz.py"\nx = a / b // 2\n'
    b = '# AOT ID: [\'3_inference\']\n#loc = loc("/srv/b/job.py":5:1)\n.file 1 "/var/tmp/torchinductor_b/xy/cxyz.py"\nx = a / b // 2\n'
    assert normalise(a) == normalise(b)
    assert "x = a / b // 2" in normalise(a) and '"<path>/job.py"' in normalise(a)
    assert normalise(a.replace("a / b", "a * b")) != normalise(b)


def test_suspects_are_the_recorded_inputs_that_differ_between_the_two_compiles() -> None:
    producer = parts(inductor_config__x="1", context={"inductor_config[dropped]": "'accuracy'", "env[TRITON_X]": "sha256:1"}, run="ci-1")
    consumer = parts(inductor_config__x="1", context={"inductor_config[dropped]": "None", "backends[cuda.flash_sdp]": "True"},
                     env=EnvFingerprint(torch="2.13.0", triton="3.9.1"), run="ci-2")
    found = [(c.name, c.stored, c.wanted) for c in suspects(producer, consumer)]
    # Context one side lacks is not a suspect (an older producer records none); the environment is.
    assert found == [("inductor_config[dropped]", "'accuracy'", "None"), ("environment[triton]", "3.9.0", "3.9.1")]
    assert suspects(None, consumer) == []


def test_identity_names_the_computation_not_its_settings() -> None:
    a = parts(inductor_config__fallback_random="False")
    b = parts("fother", inductor_config__fallback_random="True")
    other_graph = parts("fthird", gm="def forward(x, y): ...")
    assert identity(a) == identity(b) != identity(other_graph)
    assert identity(KeyComponents(layer=FX, key=GRAPH)) is None
    ident = identity(a)
    assert ident is not None
    marker = identity_marker(FX, ident, GRAPH)
    assert marker.startswith(identity_prefix(FX, ident))
    assert components_key_of_marker(FX, ident, marker) == components_key(FX, GRAPH)
    assert components_key_of_marker(FX, ident, "fx-graph.something-else") is None


# ---- the service: unsound reports, kernel quarantine, listing ---------------------------------------


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[httpx.Client]:
    with inproc_client(make_settings(tmp_path / "data")) as c:
        yield c


def report(key: str = STORED, layer: str = FX) -> UnsoundReport:
    producer = parts(context={"inductor_config[dropped]": "'accuracy'"})
    consumer = parts(context={"inductor_config[dropped]": "None"})
    return UnsoundReport(layer=layer, key=key, compared="generated code", served_digest="a" * 64, own_digest="b" * 64,
                         output_diff=["--- served/generated code", "+++ own/generated code", "-x + 1", "+max(x, 0)"],
                         producer=producer, consumer=consumer, suspects=suspects(producer, consumer))


def unsound_metric(client: httpx.Client, layer: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'kcache_unsound_keys_total{{layer="{layer}"}}'):
            return float(line.split()[-1])
    raise AssertionError("kcache_unsound_keys_total missing")


def test_an_unsound_report_is_kept_once_listed_and_counted(svc: httpx.Client) -> None:
    assert unsound_metric(svc, FX) == 0  # defined from the first scrape: an alert on > 0 works
    url = f"/v1/default/unsound/{FX}/{STORED}"
    assert_error(svc.get(url), 404, "not_found")
    first = svc.put(url, content=report().model_dump_json(), headers={"X-Kcache-Producer": "kcache/test"})
    assert first.status_code == 201, first.text
    kept = UnsoundReport.model_validate(first.json())
    assert kept.reporter == "kcache/test" and kept.reported_at is not None
    again = svc.put(url, content=report().model_copy(update={"own_digest": "c" * 64}).model_dump_json())
    assert again.status_code == 200 and again.json()["own_digest"] == "b" * 64  # the first report stands
    assert UnsoundReport.model_validate(svc.get(url).json()) == kept
    listing = svc.get("/v1/default/unsound").json()
    assert [r["key"] for r in listing["items"]] == [STORED] and listing["more"] is False
    assert [(s["name"], s["stored"], s["wanted"]) for s in listing["items"][0]["suspects"]] == [("inductor_config[dropped]", "'accuracy'", "None")]
    assert unsound_metric(svc, FX) == 1
    assert svc.get("/v1/other/unsound").json()["items"] == []


def test_a_bad_unsound_report_is_a_clear_error(svc: httpx.Client) -> None:
    url = f"/v1/default/unsound/{FX}/{STORED}"
    assert_error(svc.put(url, content=b"not json"), 422, "invalid_request", "not a JSON document")
    # The URL names the key: what the body says of it is replaced.
    assert svc.put(url, content=report(key="pt2:fx-graph-v1::fother:c1").model_dump_json()).json()["key"] == STORED
    body = json.loads(report().model_dump_json())
    del body["consumer"]
    assert_error(svc.put(url, content=json.dumps(body)), 422, "invalid_request", "consumer")
    assert_error(svc.put(f"/v1/default/unsound/{FX}/-starts-with-a-dash", content=report().model_dump_json()), 400, "invalid_key")


def test_unsound_reports_need_write_scope_to_send_and_read_scope_to_see(tmp_path: Path) -> None:
    tokens = json.dumps([{"token": READ_TOKEN, "name": "r", "scopes": ["read"]}, {"token": WRITE_TOKEN, "name": "w", "scopes": ["write"]},
                         {"token": ADMIN_TOKEN, "name": "a", "scopes": ["admin"]}])
    with inproc_client(make_settings(tmp_path / "data", tokens=tokens)) as c:
        url = f"/v1/default/unsound/{FX}/{STORED}"
        body = report().model_dump_json()
        assert c.put(url, content=body).status_code == 401
        assert c.put(url, content=body, headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 403
        assert c.put(url, content=body, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}).status_code == 201
        assert c.get("/v1/default/unsound", headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 200
        purge = {"where": ["torch=2.13.0"]}
        assert c.post("/v1/default/purge", json=purge, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}).status_code == 403
        assert c.post("/v1/default/purge", json=purge, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200


def test_a_quarantined_kernel_is_a_miss_for_every_node_and_refuses_uploads(svc: httpx.Client, kernel: Kernel) -> None:
    url = f"/v1/default/kernels/{kernel.key}"
    assert svc.put(url, content=kernel.pack).status_code == 201
    q = svc.post(f"/v1/default/entries/kernel/{kernel.key}/quarantine",
                 json={"reason": "unsound key: own compile differs", "sha256": hashlib.sha256(kernel.pack).hexdigest()})
    assert q.status_code == 201, q.text
    assert q.json()["entry"] is None  # a kernel's record is a pack, not an entry
    assert_error(svc.get(url), 404, "quarantined", "unsound key")
    assert svc.head(url).status_code == 404
    assert svc.post("/v1/default/kernels:missing", json={"keys": [kernel.key]}).json()["missing"] == [kernel.key]
    assert_error(svc.put(url, content=kernel.pack), 409, "quarantined")


def test_entries_are_listed_by_key_prefix(svc: httpx.Client) -> None:
    for key in ("fx-graph.i.aaa.f1", "fx-graph.i.aaa.f2", "fx-graph.i.bbb.f3", "fx-graph.f1"):
        assert svc.put(f"/v1/default/entries/key-components/{key}", content=b"{}").status_code == 201
    page = svc.get("/v1/default/entries/key-components", params={"prefix": "fx-graph.i.aaa.", "limit": 1}).json()
    assert [e["key"] for e in page["items"]] == ["fx-graph.i.aaa.f1"] and page["next_cursor"] == "fx-graph.i.aaa.f1"
    rest = svc.get("/v1/default/entries/key-components", params={"prefix": "fx-graph.i.aaa.", "cursor": page["next_cursor"]}).json()
    assert [e["key"] for e in rest["items"]] == ["fx-graph.i.aaa.f2"] and rest["next_cursor"] is None
    assert_error(svc.get("/v1/default/entries/key-components", params={"prefix": "a/b"}), 422, "invalid_request")


# ---- purge by recorded key part --------------------------------------------------------------------


def store_compiled(client: httpx.Client, ns: str, recorded: KeyComponents, payload: bytes, *, stored_key: str | None = None) -> str:
    """An entry as a client stores one it compiled: the entry, and its recorded parts beside it."""
    key = stored_key or f"pt2:fx-graph-v1::{recorded.key}:c1"
    assert client.put(f"/v1/{ns}/entries/{recorded.layer}/{key}", content=payload).status_code == 201
    assert client.put(f"/v1/{ns}/entries/key-components/{components_key(recorded.layer, recorded.key)}",
                      content=recorded.model_dump_json()).status_code == 201
    return key


def test_purge_deletes_what_the_recorded_parts_match_after_a_dry_run(svc: httpx.Client) -> None:
    bad = store_compiled(svc, "default", parts("fbad", inductor_config__max_autotune="True", run="ci-7"), b"graph one")
    good = store_compiled(svc, "default", parts("fgood", inductor_config__max_autotune="False", run="ci-8"), b"graph two")
    newer = store_compiled(svc, "default", parts("fnewer", env=EnvFingerprint(torch="2.15.0"), inductor_config__max_autotune="True"), b"graph three")

    plan = svc.post("/v1/default/purge", json={"where": ["inductor_config[max_autotune]=True", "torch=2.13.0"]}).json()
    assert plan["dry_run"] is True and plan["scanned"] == 3 and plan["matched"] == 1 and plan["deleted"] == 0
    assert [i["key"] for i in plan["items"]] == [bad] and plan["bytes"] == len(b"graph one")
    assert svc.get(f"/v1/default/entries/{FX}/{bad}").status_code == 200  # a dry run deletes nothing

    done = svc.post("/v1/default/purge", json={"where": ["inductor_config[max_autotune]=True", "torch=2.13.0"], "dry_run": False}).json()
    assert done["deleted"] == 1
    assert svc.get(f"/v1/default/entries/{FX}/{bad}").status_code == 404
    assert svc.get(f"/v1/default/entries/key-components/{components_key(FX, 'fbad')}").status_code == 404
    for kept in (good, newer):
        assert svc.get(f"/v1/default/entries/{FX}/{kept}").status_code == 200
    by_run = svc.post("/v1/default/purge", json={"where": ["run=ci-8"]}).json()
    assert [i["key"] for i in by_run["items"]] == [good]
    assert svc.post("/v1/default/purge", json={"where": ["torch=2.15.0"], "max_scan": 1}).json()["truncated"] is True


def test_purge_selects_kernels_by_their_recorded_triton_parts(svc: httpx.Client, kernel: Kernel) -> None:
    recorded = KeyComponents(layer="kernel", key=kernel.key, components={"options[num_warps]": part("4")}, environment=ENV)
    assert svc.put(f"/v1/default/kernels/{kernel.key}", content=kernel.pack).status_code == 201
    assert svc.put(f"/v1/default/entries/key-components/{components_key('kernel', kernel.key)}", content=recorded.model_dump_json()).status_code == 201
    assert svc.post("/v1/default/purge", json={"where": ["options[num_warps]=8"], "dry_run": False}).json()["matched"] == 0
    done = svc.post("/v1/default/purge", json={"where": ["options[num_warps]=4"], "dry_run": False}).json()
    assert (done["matched"], done["deleted"]) == (1, 1)
    assert svc.get(f"/v1/default/kernels/{kernel.key}").status_code == 404


@pytest.mark.parametrize(("where", "says"), [([], "at least 1"), (["max_autotune"], "is not a condition"), (["bogus=1"], "neither a key part")])
def test_a_bad_purge_condition_is_a_clear_error(svc: httpx.Client, where: list[str], says: str) -> None:
    assert_error(svc.post("/v1/default/purge", json={"where": where}), 422, "invalid_request", says)


def test_kcache_purge_shows_the_plan_and_deletes_only_with_yes(live_service, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=live_service.url, timeout=HANG_S) as c:
        key = store_compiled(c, "default", parts("fbad", inductor_config__max_autotune="True"), b"graph")
    args = ["purge", "--url", live_service.url, "--where", "inductor_config[max_autotune]=True"]
    assert kcache_main(args) == 1  # not a terminal, no --yes: nothing deleted
    out = capsys.readouterr()
    assert "matched   1 entry" in out.out and key in out.out and "pass --yes" in out.err
    assert kcache_main([*args, "--dry-run"]) == 0
    assert httpx.get(f"{live_service.url}/v1/default/entries/{FX}/{key}", timeout=HANG_S).status_code == 200
    assert kcache_main([*args, "--yes"]) == 0
    assert "deleted   1 entry" in capsys.readouterr().out
    assert httpx.get(f"{live_service.url}/v1/default/entries/{FX}/{key}", timeout=HANG_S).status_code == 404
    assert kcache_main(["purge", "--url", live_service.url, "--where", "nonsense"]) == 2
    assert "is not a condition" in capsys.readouterr().err
