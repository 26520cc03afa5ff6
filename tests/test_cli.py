"""The CLI as a newcomer meets it (issue #32): a mistake is a clear error and a non-zero exit,
``gc`` deletes nothing without ``--yes`` (or a yes at the prompt), durations and sizes carry
units, errors name the thing at fault, ``--version``, a bare ``kcache``, ``serve`` on a taken port,
and output for people (sizes, plurals, records). Exit codes: 0 done, 1 failed, 2 wrong usage or
setting (README, "CLI")."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import tomllib
from kcache import __version__
from kcache.cli.commands import main
from kcache.store.counters import Stats, write_stats
from kcache_schemas.models import EnvFingerprint, WorkloadManifest

from kcache_testkit.pace import HANG_S
from kcache_testkit.ports import free_port
from kcache_testkit.service import clean_env

pytest_plugins = ["live"]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``kcache ARGV``: exit code, stdout, stderr (argparse's usage errors included)."""
    capsys.readouterr()
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        rc = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(autouse=True)
def _no_client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KCACHE_URL", "KCACHE_TOKEN", "KCACHE_NAMESPACE", "KCACHE_MODE", "KCACHE_STATS_FILE", "KCACHE_RUN_ID"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def cache_dir(tmp_path: Path, real_kernel_dirs: list[Path]) -> Path:
    """A Triton cache dir holding the four real kernel dirs."""
    root = tmp_path / "triton-cache"
    for d in real_kernel_dirs:
        shutil.copytree(d, root / d.name)
    return root


# ---- 0. names a user can install -----------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
# PyPI's `kcache` is an unrelated project; ours are not published yet: a doc that tells a user to
# install one of our names from the registry sends them to the wrong package or to an error.
OUR_NAMES = re.compile(r"^['\"]?kcache(-server|-client)?(\[[a-z0-9,]+\])?['\"]?$")


def test_no_doc_or_message_installs_our_names_from_the_registry() -> None:
    """Before: ``kcache serve`` said ``pip install kcache`` (PyPI's unrelated 0.0.3), the docs
    ``pip install 'kcache-client[signing]'`` (no such distribution) and ``'kcache[s3]'``."""
    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    client = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())["project"]["name"]
    assert (server, client) == ("kcache-server", "kcache-client")
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]
    sources = sorted((REPO / "client").rglob("*.py")) + sorted((REPO / "service").rglob("*.py")) + sorted((REPO / "schemas").rglob("*.py"))
    wrong = []
    for path in docs + sources:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for command in line.split("pip install ")[1:]:
                args = re.split(r"&&|;|#|`|\(|\)|\|", command)[0].split()
                if "@" not in args and any(OUR_NAMES.match(arg) for arg in args):  # `name @ git+URL`: not the registry
                    wrong.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert wrong == []
    from kcache.cli.commands import SERVER_INSTALL_HINT

    assert "not on PyPI yet" in SERVER_INSTALL_HINT and "pip install <checkout>" in SERVER_INSTALL_HINT
    readme = (REPO / "README.md").read_text()
    assert "pip install -e . && kcache serve" in readme and "PyPI's `kcache` is an **unrelated project**" in readme


# ---- 1. mistakes pass silently ------------------------------------------------------------------


def test_push_of_a_missing_dir_is_an_error_and_an_empty_one_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Before: ``pushed 0 kernels … from /nonexistent``, exit 0."""
    rc, out, err = cli(capsys, "push", str(tmp_path / "nonexistent"), "--url", "http://127.0.0.1:9")
    assert rc == 1 and out == "" and f"kcache push: {tmp_path / 'nonexistent'}: no such directory" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = cli(capsys, "push", str(tmp_path / "empty"), "--url", "http://127.0.0.1:9")
    assert rc == 0 and "no kernel dirs in" in err and "nothing to push" in err


@pytest.mark.parametrize(("url", "says"), [
    ("not-a-url", "KCACHE_URL='not-a-url': not a service URL: use http(s)://host[:port]"),
    ("ftp://127.0.0.1", "KCACHE_URL='ftp://127.0.0.1': not a service URL"),
    ("http://[::1", "KCACHE_URL='http://[::1': not a URL"),
])
def test_a_kcache_url_that_is_no_url_is_refused_naming_it(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str, says: str) -> None:
    """Before: ``KCACHE_URL=not-a-url`` printed nothing useful (the stats said ServiceUnavailable)."""
    monkeypatch.setenv("KCACHE_URL", url)
    rc, _, err = cli(capsys, "ls")
    assert rc == 2 and says in err, err


def test_pin_of_an_unknown_workload_is_refused_unless_ahead(capsys: pytest.CaptureFixture[str], live_service) -> None:  # type: ignore[no-untyped-def]
    """Before: ``kcache pin nosuchworkload`` → ``pinned``, exit 0 (a typo pinned nothing useful)."""
    remote = ("--url", live_service.url)
    rc, out, err = cli(capsys, "pin", "nosuchworkload", *remote)
    assert rc == 1 and out == "" and "no workload 'nosuchworkload' in namespace 'default'" in err and "--ahead" in err
    assert httpx.get(f"{live_service.url}/v1/default/pins", timeout=HANG_S).json()["items"] == []
    assert cli(capsys, "pin", "later", "--ahead", *remote)[0] == 0
    manifest = WorkloadManifest(name="serving", fingerprint=EnvFingerprint(torch="2.13.0"), kernels=[])
    assert httpx.put(f"{live_service.url}/v1/default/workloads/serving", json=manifest.model_dump(mode="json"), timeout=HANG_S).status_code == 201
    rc, out, _ = cli(capsys, "pin", "serving", *remote)
    assert rc == 0 and "pinned workload 'serving'" in out
    rc, _, err = cli(capsys, "pin", *remote)
    assert rc == 0 and "2 pinned workloads" in err


def test_a_token_an_open_server_does_not_check_is_said(capsys: pytest.CaptureFixture[str], live_service) -> None:  # type: ignore[no-untyped-def]
    """Before: ``--token wrong`` against a server without tokens was accepted silently (the user
    believed the cache was protected). It still works (open is open), once said on stderr."""
    rc, _, err = cli(capsys, "ls", "--url", live_service.url, "--token", "not-the-real-token")
    assert rc == 0 and err.count("has no tokens (open, loopback only): the token given (KCACHE_TOKEN or --token) is not checked") == 1, err
    rc, _, err = cli(capsys, "ls", "--url", live_service.url)
    assert rc == 0 and "not checked" not in err


def _stats_file(tmp_path: Path, hits: int, misses: int) -> Path:
    s = Stats()
    for _ in range(hits):
        s.hit("kernel", 0, 0.0)
    for _ in range(misses):
        s.miss("kernel", "not_found")
    s.put("key-components", 2000)  # kcache's own bookkeeping: not a layer users switched on
    path = tmp_path / f"stats-{hits}-{misses}.json"
    write_stats(path, s.document(run_id="r", namespace="default"))
    return path


def test_fail_under_reads_80_percent_80_and_0_8_alike_and_refuses_out_of_range(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Before: ``--fail-under 0.8`` on a 50 % run passed (0.8 %), and ``80%`` was refused."""
    half, most = _stats_file(tmp_path, 1, 1), _stats_file(tmp_path, 9, 1)
    for bar in ("0.8", "80", "80%"):
        assert cli(capsys, "stats", "--file", str(half), "--fail-under", bar)[0] == 2, bar
        rc, out, _ = cli(capsys, "stats", "--file", str(most), "--fail-under", bar)
        assert rc == 0 and "Bar (--fail-under 80%)" in out, bar
    for bad, says in (("150", "within 0-100 %"), ("101%", "within 0-100 %"), ("-5%", "within 0-100 %"), ("most", "is not a hit rate")):
        rc, _, err = cli(capsys, "stats", "--file", str(most), f"--fail-under={bad}")
        assert rc == 2 and says in err, (bad, err)


# ---- 1b. numbers that mislead -------------------------------------------------------------------


def test_compile_time_saved_is_the_largest_layer_not_the_sum_of_nested_layers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Before: "Compile time saved (est.) 15.9 s" where the first call went from 17.24 to 10.70 s:
    an AOTAutograd entry's recorded time covers its FX graphs', which covers their kernels', and
    the report added the three up."""
    s = Stats()
    s.hit("aot-autograd", 100, 8.0)
    s.hit("fx-graph", 100, 5.5)
    for _ in range(5):
        s.hit("kernel", 10, 5.5 / 5)  # the graph's compile time shared among its kernels
    path = tmp_path / "nested.json"
    write_stats(path, s.document(run_id="r"))
    rc, out, _ = cli(capsys, "stats", "--file", str(path))
    assert rc == 0
    assert re.search(r"Compile time saved \(est\.\)\s+8\.0 s", out) and "19.0 s" not in out, out
    assert "layers nest" in out
    table = out.split("Per layer", 1)[1]
    assert re.search(r"aot-autograd .* 8\.0\n", table) and re.search(r"fx-graph .* 5\.5\n", table)  # each layer's own credit stays
    rc, out, _ = cli(capsys, "stats", "--file", str(path), "--format", "json")
    assert json.loads(out)["totals"]["saved_s"] == 8.0


def test_a_hit_credits_the_same_saved_time_from_the_service_and_from_the_local_tier(live_service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Before: the same hit credited 15.9 s in one run (from the service, whose header carries the
    producer's time) and 0.0 s in the next (from the node's local tier, which has no header)."""
    from kcache.config import ClientConfig
    from kcache.runtime import Runtime
    from kcache.store import fx_graph_envelope

    inductor_json = json.dumps({"data": base64.b64encode(b"graph").decode(), "time_taken_ms": 4200}).encode()
    entries = {"fx-graph": fx_graph_envelope.encode(inductor_json), "aot-autograd": inductor_json}
    producer = Runtime(ClientConfig(url=live_service.url, local_dir=str(tmp_path / "producer")))
    for layer, data in entries.items():
        assert data is not None
        producer.put_entry(layer, f"pt2:{layer}::k:c1", data, 4.2, now=True)
    producer.close()
    credited = []
    for _ in range(2):  # the first from the service, the second from the node's local tier
        rt = Runtime(ClientConfig(url=live_service.url, local_dir=str(tmp_path / "node")))
        for layer in entries:
            assert rt.get_entry(layer, f"pt2:{layer}::k:c1") is not None
        for writer in [th for th in threading.enumerate() if th.name == "kcache-local-put"]:
            writer.join()  # the fetched entries' local copies
        credited.append({layer: c.saved_s for layer, c in rt.stats.snapshot().items()})
        rt.close()
    assert credited == [{"fx-graph": 4.2, "aot-autograd": 4.2}] * 2


# ---- 2. destructive gc safety ------------------------------------------------------------------


def test_gc_durations_need_units_and_nothing_is_deleted_without_yes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, live_service, cache_dir: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Before: ``kcache gc --older-than 7`` meant 7 seconds and evicted with no confirmation."""
    remote = ("--url", live_service.url)
    assert cli(capsys, "push", str(cache_dir), *remote)[0] == 0

    def stored() -> int:
        return len(httpx.get(f"{live_service.url}/v1/default/kernels", timeout=HANG_S).json()["items"])

    for flag in ("--older-than", "--min-age"):
        rc, _, err = cli(capsys, "gc", *remote, flag, "7")
        assert rc == 2 and f"argument {flag}: '7' has no unit: write 7s, 7m, 7h or 7d" in err
    assert stored() == 4
    everything = ("gc", *remote, "--max-bytes", "0", "--min-age", "0")
    # stdin is no terminal here: the plan, then nothing deleted and exit 1.
    rc, out, err = cli(capsys, *everything)
    assert rc == 1 and "(dry run: nothing is deleted)" in out and "first evictions" in out
    assert "nothing deleted: pass --yes to evict 4 items" in err and stored() == 4
    rc, out, _ = cli(capsys, *everything, "--dry-run")
    assert rc == 0 and "dry run" in out and stored() == 4
    # On a terminal it asks; anything but yes keeps everything.
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    answers: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: answers.append(prompt) or "n")
    rc, _, err = cli(capsys, *everything)
    assert rc == 0 and "nothing deleted" in err and stored() == 4
    assert answers and answers[0].startswith("Evict 4 items (") and "[y/N]" in answers[0]
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    rc, out, _ = cli(capsys, *everything)
    assert rc == 0 and "evicted 4 items" in out and stored() == 0
    assert cli(capsys, "push", str(cache_dir), *remote)[0] == 0
    rc, out, _ = cli(capsys, *everything, "--older-than", "1s", "--yes")
    assert rc == 0 and "evicted 4 items" in out and stored() == 0


# ---- 3. errors with the thing at fault -----------------------------------------------------------


def test_errors_name_the_url_and_the_namespace_rule(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``GET /v1/default/kernels: ConnectError`` (no host); ``--url …/v1`` → ``HTTP 404``;
    ``--namespace a/b`` → 404; ``--namespace UPPER`` → ``invalid_key``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    rc, _, err = cli(capsys, "ls", "--url", closed)
    assert rc == 1 and f"GET {closed}/v1/default/kernels: ConnectError" in err and "check --url / KCACHE_URL" in err
    rc, _, err = cli(capsys, "ls", "--url", f"{closed}/v1/")
    assert rc == 2 and f"--url='{closed}/v1/': ends in /v1, the API's prefix: give the service's root ({closed})" in err
    for ns in ("a/b", "UPPER"):
        rc, _, err = cli(capsys, "ls", "--url", closed, "--namespace", ns)
        assert rc == 2 and f"--namespace={ns!r}: a namespace must be 1-63 chars of [a-z0-9._-]" in err


# ---- 4. expected and missing ----------------------------------------------------------------------


def test_version_and_a_bare_kcache_print_what_there_is(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "--version")
    assert rc == 0 and out.strip() == f"kcache {__version__}"
    rc, out, _ = cli(capsys)
    assert rc == 0 and out.startswith("usage: kcache") and "push" in out and "Exit codes" in out


def test_serve_on_a_taken_port_says_so_before_serving(tmp_path: Path) -> None:
    """Before: ``serving on http://127.0.0.1:8765``, then ``[Errno 98] address already in use``, rc 3."""
    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        proc = subprocess.run([sys.executable, "-m", "kcache.cli", "serve", "--port", str(port), "--data-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=HANG_S, env=clean_env(KCACHE_AUTOLOAD="0"))
    assert proc.returncode == 1, proc.stderr
    assert f"kcache: cannot serve on 127.0.0.1:{port}: port {port} is taken" in proc.stderr
    assert "serving on" not in proc.stderr and "Traceback" not in proc.stderr


def test_stats_with_no_argument_shows_this_machines_processes_until_zero(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, live_service,  # type: ignore[no-untyped-def]
) -> None:
    """Before: ``kcache stats`` with no argument said "give --file PATH or --run ID". Now, like
    ``sccache --show-stats``: every process that used kcache on this machine merged in at exit
    (into the local tier's ``stats.json``), until ``--zero``."""
    local = tmp_path / "local"
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(local))
    rc, out, err = cli(capsys, "stats")
    assert rc == 1 and out == "" and f"no stats recorded on this machine yet ({local / 'stats.json'}" in err
    job = "\n".join([  # a job's runtime, without torch (the hooks' part is not what is tested)
        "from kcache.config import ClientConfig",
        "from kcache.current import ensure_runtime",
        "rt = ensure_runtime(ClientConfig.from_env())",
        "assert rt.get_entry('fx-graph', 'pt2:fx-graph-v1::nosuchkey:c1') is None",
    ])
    env = clean_env(KCACHE_URL=live_service.url, KCACHE_LOCAL_DIR=str(local), KCACHE_AUTOLOAD="0")
    idle = "from kcache.config import ClientConfig; from kcache.current import ensure_runtime; ensure_runtime(ClientConfig.from_env())"  # no cache work: adds nothing
    for code in (job, job, idle):
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S)
        assert proc.returncode == 0, proc.stderr
    rc, out, err = cli(capsys, "stats")
    assert rc == 0 and "kcache stats: this machine (" in err and "--zero to start over" in err
    assert out.startswith("kcache stats: namespace default, 2 processes") and re.search(r"  misses\s+2\n", out), out
    rc, out, _ = cli(capsys, "stats", "--zero")
    assert rc == 0 and "start over" in out and not (local / "stats.json").exists()
    assert cli(capsys, "stats")[0] == 1
    rc, _, err = cli(capsys, "stats", "--zero", "--file", "x")
    assert rc == 2 and "--zero" in err


# ---- 5. polish ----------------------------------------------------------------------------------


def test_output_for_people_sizes_plurals_and_records(capsys: pytest.CaptureFixture[str], live_service, tmp_path: Path, real_kernel_dirs: list[Path]) -> None:  # type: ignore[no-untyped-def]
    """Before: ``pushed 1 kernels (0.0 MB)``, ``producer {'kcache_version': '0.1.0'}``, sizes in
    raw bytes, and the internal ``key-components`` layer in the per-layer table."""
    one = tmp_path / "one"
    shutil.copytree(real_kernel_dirs[0], one / real_kernel_dirs[0].name)
    rc, out, _ = cli(capsys, "push", str(one), "--url", live_service.url)
    assert rc == 0 and out.startswith("pushed 1 kernel (") and " kB) in " in out, out
    rc, out, _ = cli(capsys, "inspect", real_kernel_dirs[0].name, "--url", live_service.url)
    assert rc == 0 and f"producer       kcache_version={__version__}" in out and "{" not in out, out
    assert " kB unpacked, " in out and " kB packed" in out
    rc, _, err = cli(capsys, "ls", "--url", live_service.url)
    assert rc == 0 and err.strip() == "1 kernel"
    rc, out, _ = cli(capsys, "stats", "--file", str(_stats_file(tmp_path, 1, 0)))
    table = out.split("Per layer", 1)[1].split("\n\n", 1)[0]
    assert "  kernel " in table and "\n  key-components " not in table
    assert "kcache's own: 1 upload (2.0 kB) of key-components (key parts for kcache explain)" in table
    assert "0.0 MB" not in out


# ---- 6. keys you can copy between commands; listing and deleting entries --------------------------

FX_KEY = "fylzd5osyn5ed4dcdehreis7nop4bbwdmnehs55doeuuqtjeotsp"  # Inductor's own key, as torch logs it
FX_STORED = f"pt2:fx-graph-v1::{FX_KEY}:c1"  # as torch's remote cache stores it
AUTOTUNE_STORED = "pt2:3b8e0c1f::triton_poi_fused_add_0:c1"  # an id that is a hash: shown as stored


def _put_entries(url: str) -> None:
    for layer, key in (("fx-graph", FX_STORED), ("autotune", AUTOTUNE_STORED), ("key-components", f"fx-graph.{FX_KEY}")):
        assert httpx.put(f"{url}/v1/default/entries/{layer}/{key}", content=f"{layer} bytes".encode(), timeout=HANG_S).status_code == 201


def test_an_entry_key_any_command_prints_is_accepted_by_every_command(capsys: pytest.CaptureFixture[str], live_service) -> None:  # type: ignore[no-untyped-def]
    """Before: ``kcache explain`` printed ``fx-graph f7p5…``, and ``kcache inspect --entry fx-graph
    f7p5…`` answered 404 (it needed ``pt2:fx-graph-v1::f7p5…:c1``); no command listed entries."""
    remote = ("--url", live_service.url)
    _put_entries(live_service.url)
    rc, out, err = cli(capsys, "ls", "--entries", *remote)
    assert rc == 0 and err.strip() == "2 entries", err
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert rows == {"fx-graph": FX_KEY, "autotune": AUTOTUNE_STORED}  # kcache's own key-components layer is not listed
    for key in (FX_KEY, FX_STORED):
        rc, out, _ = cli(capsys, "inspect", "--entry", "fx-graph", key, *remote)
        assert rc == 0 and f"key            {FX_KEY}\n" in out and f"stored as      {FX_STORED}" in out, out
    rc, out, _ = cli(capsys, "inspect", "--entry", "autotune", AUTOTUNE_STORED, *remote)
    assert rc == 0 and f"key            {AUTOTUNE_STORED}\n" in out and "stored as" not in out
    rc, out, err = cli(capsys, "inspect", "--entry", "fx-graph", "nosuchkey", *remote)
    assert rc == 1 and out == "" and "no fx-graph entry 'nosuchkey' in namespace 'default'" in err and "kcache ls --entries fx-graph" in err
    rc, out, _ = cli(capsys, "ls", "--entries", "fx-graph", "--prefix", FX_KEY[:6], "--json", *remote)
    assert rc == 0 and [(e["key"], e["shown_key"]) for e in json.loads(out)] == [(FX_STORED, FX_KEY)]
    rc, _, err = cli(capsys, "ls", "--entries", "No/Such", *remote)
    assert rc == 2 and "--entries: layer 'No/Such' must be" in err


def test_ls_limit_says_what_it_left_out(capsys: pytest.CaptureFixture[str], live_service, cache_dir: Path) -> None:  # type: ignore[no-untyped-def]
    remote = ("--url", live_service.url)
    assert cli(capsys, "push", str(cache_dir), *remote)[0] == 0
    rc, out, err = cli(capsys, "ls", "--limit", "3", *remote)
    assert rc == 0 and len(out.splitlines()) == 1 + 3 and err.strip() == "the first 3 kernels; more: raise --limit"
    rc, out, err = cli(capsys, "ls", "--limit", "4", *remote)
    assert rc == 0 and len(out.splitlines()) == 1 + 4 and err.strip() == "4 kernels"
    _put_entries(live_service.url)
    rc, out, err = cli(capsys, "ls", "--entries", "--limit", "1", *remote)
    assert rc == 0 and len(out.splitlines()) == 2 and err.strip() == "the first 1 entry; more: raise --limit"
    for bad in ("0", "ten"):
        rc, _, err = cli(capsys, "ls", "--limit", bad, *remote)
        assert rc == 2 and "argument --limit" in err


def test_gc_prints_whole_keys_in_the_form_other_commands_accept(capsys: pytest.CaptureFixture[str], live_service) -> None:  # type: ignore[no-untyped-def]
    """Before: ``gc`` cut every key at 52 characters."""
    _put_entries(live_service.url)
    rc, out, _ = cli(capsys, "gc", "--url", live_service.url, "--max-bytes", "0", "--min-age", "0", "--dry-run")
    assert rc == 0 and f" {FX_KEY} " in out and f" {AUTOTUNE_STORED} " in out, out


def test_rm_deletes_only_after_yes_and_nothing_when_a_key_is_wrong(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, live_service, cache_dir: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Deleting a kernel or an entry from the CLI, as safely as ``gc``: the plan first; ``--yes``
    or a yes at the prompt; one key that is not stored (a typo) deletes nothing at all."""
    remote = ("--url", live_service.url)
    assert cli(capsys, "push", str(cache_dir), *remote)[0] == 0
    _put_entries(live_service.url)
    keys = sorted(d.name for d in cache_dir.iterdir())
    base = f"{live_service.url}/v1/default"

    def stored(key: str) -> bool:
        return httpx.head(f"{base}/kernels/{key}", timeout=HANG_S).status_code == 200

    rc, out, err = cli(capsys, "rm", keys[0], *remote)  # stdin is no terminal here
    assert rc == 1 and f"delete  kernel {keys[0]}" in out and "nothing deleted: pass --yes to delete 1 kernel (" in err and stored(keys[0])
    typo = keys[1][:-2] + ("AQ" if keys[1][-2:] != "AQ" else "QA")
    rc, _, err = cli(capsys, "rm", keys[0], typo, "--yes", *remote)
    assert rc == 1 and f"nothing deleted: no kernels {typo} in namespace 'default'" in err and stored(keys[0])
    rc, _, err = cli(capsys, "rm", "not-a-key", "--yes", *remote)
    assert rc == 2 and "kernel key 'not-a-key' is neither" in err
    rc, out, err = cli(capsys, "rm", keys[0], keys[1], "--dry-run", *remote)
    assert rc == 0 and out.count("would delete  kernel ") == 2 and "dry run: 2 kernels (" in err and stored(keys[0])
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    rc, _, err = cli(capsys, "rm", keys[0], *remote)
    assert rc == 0 and "nothing deleted" in err and stored(keys[0])
    monkeypatch.setattr("builtins.input", lambda prompt: "yes")
    rc, out, _ = cli(capsys, "rm", keys[0], *remote)
    assert rc == 0 and "deleted 1 kernel (" in out and not stored(keys[0]) and stored(keys[1])
    rc, out, _ = cli(capsys, "delete", "--entry", "fx-graph", FX_KEY, "--yes", *remote)  # the short form ls printed
    assert rc == 0 and f"delete  fx-graph {FX_KEY}" in out and "deleted 1 fx-graph entry" in out
    assert httpx.head(f"{base}/entries/fx-graph/{FX_STORED}", timeout=HANG_S).status_code == 404
    rc, _, err = cli(capsys, "rm", "--entry", "fx-graph", FX_KEY, "--yes", *remote)
    assert rc == 1 and f"no fx-graph entry {FX_KEY}" in err


# ---- 4b. kcache doctor ------------------------------------------------------------------------------


def test_doctor_says_where_each_setting_came_from_and_whether_the_service_takes_the_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, live_service, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("KCACHE_NAMESPACE", "team-a")
    rc, out, _ = cli(capsys, "doctor", "--url", live_service.url)
    assert rc == 0 and out.rstrip().endswith("no problems found"), out
    assert f"  url             {live_service.url}  (--url)\n" in out
    rows = json.loads(cli(capsys, "doctor", "--url", live_service.url, "--json")[1])["checks"]
    assert rows["url"] == f"{live_service.url}  (--url)" and rows["namespace"] == "team-a  (KCACHE_NAMESPACE)"
    assert rows["token"].startswith("none") and rows["service"].startswith("answers in ") and "kcache " in rows["service"]
    assert rows["access"] == "read on namespace 'team-a': ok" and rows["local tier"].startswith(str(tmp_path / "local"))
    assert rows["layers"].startswith("fx-graph, autotune,")
    # A token an open server does not check is a problem; the token itself is never printed.
    rc, out, _ = cli(capsys, "doctor", "--url", live_service.url, "--token", "s3cret-token-value", "--json")
    report = json.loads(out)
    assert rc == 1 and report["checks"]["token"] == "from --token" and "s3cret" not in out
    assert any("not checked" in p for p in report["problems"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    rc, out, _ = cli(capsys, "doctor", "--url", closed)
    assert rc == 1 and f"the service at {closed} does not answer" in out
    assert cli(capsys, "doctor", "--url", closed, "--offline")[0] == 0
    rc, _, err = cli(capsys, "doctor", "--namespace", "UPPER")
    assert rc == 2 and "--namespace='UPPER'" in err
    monkeypatch.delenv("KCACHE_NAMESPACE")
    rc, out, _ = cli(capsys, "doctor")
    assert rc == 1 and "no service URL" in out


def test_doctor_names_a_token_the_service_refuses(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from live import LiveService

    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path / "local"))
    grants = [{"token": "reader-token-0123456789", "name": "reader", "namespaces": ["team-a"], "scopes": ["read"]}]
    with LiveService(tmp_path / "svc", tokens=json.dumps(grants)) as svc:
        rc, out, _ = cli(capsys, "doctor", "--url", svc.url, "--namespace", "team-a", "--token", "reader-token-0123456789")
        assert rc == 0 and "read on namespace 'team-a': ok" in out and "no tokens" not in out, out
        rc, out, _ = cli(capsys, "doctor", "--url", svc.url, "--namespace", "team-b", "--token", "reader-token-0123456789")
        assert rc == 1 and "the service refuses this token on namespace 'team-b'" in out, out
        rc, out, _ = cli(capsys, "doctor", "--url", svc.url, "--token", "wrong-token-0123456789")
        assert rc == 1 and "unknown bearer token" in out, out


# ---- 4c. the node's local tier ---------------------------------------------------------------------


def test_local_tier_scan_and_a_delete_that_asks_first(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Managing ``~/.cache/kcache/client`` (10 GB by default) like huggingface-cli's
    scan-cache/delete-cache: what is there per service, namespace and layer; a delete shows its
    plan and needs ``--yes`` or a yes at the prompt."""
    import os

    from kcache.store.local_store import LocalEntryStore

    root = tmp_path / "tier"
    prod, staging = "http://kcache.prod:8765", "http://kcache.staging:8765"
    for url, ns, layer, n in ((prod, "default", "fx-graph", 3), (prod, "default", "kernel", 2), (prod, "team-a", "fx-graph", 1), (staging, "default", "fx-graph", 4)):
        store = LocalEntryStore(root, ns, url=url)
        for i in range(n):
            store.put(layer, f"{layer}-{i}", b"x" * 1000)
    old = LocalEntryStore(root, "default", url=staging)._path("fx-graph", "fx-graph-0")
    os.utime(old, (1_000_000_000, 1_000_000_000))  # last used in 2001
    monkeypatch.setenv("KCACHE_URL", prod)
    rc, out, err = cli(capsys, "local", "ls", "--local-dir", str(root))
    assert rc == 0 and f"{root}: 10 files, 10.0 kB of 10.7 GB" in err and f"* = {prod}" in err
    marked = [line.split()[1:4] for line in out.splitlines()[1:] if line.split()[0].endswith("*")]
    assert marked == [["default", "fx-graph", "3"], ["default", "kernel", "2"], ["team-a", "fx-graph", "1"]]

    def files() -> int:
        return sum(1 for p in (root / "entries").rglob("*") if p.is_file() and not p.name.startswith("."))

    rc, _, err = cli(capsys, "local", "rm", "--local-dir", str(root), "--namespace", "default")
    assert rc == 1 and "nothing deleted: pass --yes to delete 9 files (9.0 kB) of 10.0 kB" in err and files() == 10
    rc, out, _ = cli(capsys, "local", "rm", "--local-dir", str(root), "--url", prod, "--layer", "fx-graph", "--dry-run")
    assert rc == 0 and out.startswith("would delete 4 files (4.0 kB)") and files() == 10
    rc, _, err = cli(capsys, "local", "rm", "--local-dir", str(root), "--older-than", "7")
    assert rc == 2 and "'7' has no unit" in err
    rc, out, _ = cli(capsys, "local", "rm", "--local-dir", str(root), "--older-than", "30d", "--yes")
    assert rc == 0 and out.startswith("deleted 1 file (1.0 kB)") and not old.exists() and files() == 9
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    rc, out, _ = cli(capsys, "local", "rm", "--local-dir", str(root), "--url", prod, "--namespace", "default", "--layer", "kernel")
    assert rc == 0 and out.startswith("deleted 2 files") and files() == 7
    assert LocalEntryStore(root, "default", url=prod).get("kernel", "kernel-0") is None  # a job now misses and asks the service
    rc, _, err = cli(capsys, "local", "rm", "--local-dir", str(root), "--layer", "jit", "--yes")
    assert rc == 0 and "nothing to delete" in err
    rc, _, err = cli(capsys, "local", "rm", "--local-dir", str(root), "--namespace", "A/B")
    assert rc == 2 and "namespace" in err
    rc, out, _ = cli(capsys, "local")
    assert rc == 0 and "rm" in out and "ls" in out


# ---- 4d. progress on long operations ---------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_warm_shows_progress_on_a_terminal_and_gc_shows_the_wait(monkeypatch: pytest.MonkeyPatch, live_service, cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """Before: ``warm`` and ``gc`` said nothing until they were done (minutes for a large
    workload, or a GC on S3). On a terminal: a progress line; in logs and pipes: none."""
    from kcache.cli.progress import Waiting
    from kcache.store.fingerprint import current

    remote = ("--url", live_service.url)
    assert cli(capsys, "push", str(cache_dir), *remote)[0] == 0
    keys = sorted(d.name for d in cache_dir.iterdir())
    manifest = WorkloadManifest(name="serving", fingerprint=current(), kernels=keys)
    assert httpx.put(f"{live_service.url}/v1/default/workloads/serving", json=manifest.model_dump(mode="json"), timeout=HANG_S).status_code == 201
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["warm", "serving", "--local-dir", str(tmp_path / "local"), *remote]) == 0
    assert "\rwarm serving [" in terminal.getvalue() and "] 4/4 " in terminal.getvalue(), terminal.getvalue()
    with Waiting("gc: the service is evicting", every_s=0.01):
        while "evicting…" not in terminal.getvalue():  # a request the service answers when done
            time.sleep(0.01)
    assert "\rgc: the service is evicting… 0s" in terminal.getvalue() and terminal.getvalue().endswith("\r\033[K")
    monkeypatch.undo()
    rc, _, err = cli(capsys, "warm", "serving", "--local-dir", str(tmp_path / "local2"), *remote)
    assert rc == 0 and "\r" not in err  # not a terminal: the summary line only


# ---- 4e. shell completion ---------------------------------------------------------------------------


def test_bash_completion_offers_commands_options_and_layers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, script, _ = cli(capsys, "completion", "bash")
    assert rc == 0 and "complete -o default -F _kcache kcache" in script
    (tmp_path / "kcache.bash").write_text(script)
    cases = {
        "kcache pu": "pull purge push",
        "kcache local ": "ls rm",
        "kcache local rm --la": "--layer",
        "kcache ls --url http://x --en": "--entries",  # an option's value is no command
        "kcache inspect --entry fx": "fx-graph",
        "kcache stats --format j": "json junit",
        "kcache ls --url http://x --li": "--limit",
        "kcache push ": "",  # a directory: the shell's own file completion
        "kcache completion ": "bash zsh fish",
    }
    probe = "\n".join([f"source {tmp_path / 'kcache.bash'}"] + [
        f'COMP_WORDS=({" ".join(repr(w) for w in (line.split(" ") if not line.endswith(" ") else [*line.split(), ""]))}); '
        'COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=(); _kcache; echo "${COMPREPLY[*]}"'
        for line in cases
    ])
    out = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    got = dict(zip(cases, out.stdout.splitlines(), strict=True))
    assert got == cases
    for shell in ("zsh", "fish"):
        rc, text, _ = cli(capsys, "completion", shell)
        assert rc == 0 and "kcache" in text
    assert "bashcompinit" in cli(capsys, "completion", "zsh")[1]
    assert "complete -c kcache -n '__fish_seen_subcommand_from rm' -l entry -xa" in cli(capsys, "completion", "fish")[1]
    assert cli(capsys, "completion", "tcsh")[0] == 2


def test_every_argument_of_every_command_has_help() -> None:
    """Before: ``--json`` and positional arguments without help text."""
    import argparse

    from kcache.cli.commands import build_parser
    from kcache.cli.completion import _paths

    bare = [f"{' '.join(path) or 'kcache'} {a.option_strings or a.dest}" for path, p in _paths(build_parser()).items()
            for a in p._actions if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert bare == []


def test_every_kcache_command_the_docs_show_parses() -> None:
    """The guides' commands are real: each ``$ kcache ...`` line of README and docs parses with
    today's CLI (a renamed option or command fails here, not in a reader's shell)."""
    import shlex

    from kcache.cli.commands import build_parser

    parser = build_parser()
    shown = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in path.read_text().splitlines():
            if line.startswith("$ kcache "):
                command = re.split(r"\s[|>]|\s#", line[2:])[0]
                shown.append((path.name, shlex.split(command)[1:]))
    assert len(shown) >= 10
    for name, argv in shown:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{name}: kcache {' '.join(argv)} does not parse")
        assert args.command is not None, (name, argv)
