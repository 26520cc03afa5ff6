"""The ``dynamo`` layer: Dynamo's precompile packages (``TORCH_CACHING_PRECOMPILE=1``) served
fleet-wide, so a fresh node skips Dynamo tracing too (``kcache.layers.dynamo.packages``).

The end-to-end test runs a user's job (``tests/dynamo_job.py``) as fresh interpreters in the
user's default environment (``tests/test_host_safety.py``'s ``Node``: own HOME and TMPDIR, no
cache dir set, activation through ``KCACHE_URL`` at interpreter start, exit right after the
compile); the job never calls ``torch.compiler.save_cache_artifacts()``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_host_safety import Node

from kcache_testkit.pace import HANG_S

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch
pytest_plugins = ["live"]

from kcache.config import ClientConfig  # noqa: E402
from kcache.layers.dynamo import package_envelope as dynamo_entries  # noqa: E402
from kcache.transport.http import KcacheClient  # noqa: E402
from kcache_schemas import signed_envelope as envelope  # noqa: E402
from kcache_schemas.signed_envelope import is_signed  # noqa: E402

JOB = Path(__file__).with_name("dynamo_job.py")


def _torch_serves_packages() -> bool:
    """torch 2.13+: ``DiskDynamoCache`` writes packages through ``_write_to_local_cache`` (torch
    2.9 writes them only when ``load_cache_artifacts`` populates its caches, and its
    ``DynamoCache.load`` breaks on ``torch.compile(nn.Module)`` with precompile on)."""
    import torch._dynamo.package as package

    cls = getattr(package, "DiskDynamoCache", None)
    return callable(getattr(cls, "_write_to_local_cache", None)) and callable(getattr(cls, "load", None))


needs_packages = pytest.mark.skipif(
    not _torch_serves_packages(), reason=f"torch {torch.__version__} has no DiskDynamoCache._write_to_local_cache: kcache does not serve the dynamo layer there"
)


def run_node(node: Node, prelude: str = "", **kcache: str) -> dict[str, Any]:
    """Run the job on ``node``; ``prelude``: Python run first in the same interpreter (a test's
    patch of kcache), the job then runs as ``__main__`` as always."""
    stats = node.root / "stats.json"
    env = node.env(TORCH_CACHING_PRECOMPILE="1", KCACHE_STATS_FILE=str(stats), **kcache)
    argv = [sys.executable, "-c", f"{prelude}\nimport runpy; runpy.run_path({str(JOB)!r}, run_name='__main__')"] if prelude else [sys.executable, str(JOB)]
    proc = subprocess.run(argv, env=env, cwd=node.root, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT "):])
    result["stats"] = json.loads(stats.read_text())["layers"] if stats.exists() else {}
    result["stderr"] = proc.stderr
    result["kcache_lines"] = [ln for ln in proc.stderr.splitlines() if "kcache:" in ln]
    return result


@needs_packages
@pytest.mark.slow
def test_a_fresh_node_skips_dynamo_with_the_package_another_node_compiled(live_service, tmp_path: Path) -> None:
    fleet = {"KCACHE_URL": live_service.url, "KCACHE_WORKLOAD": "precompiled", "KCACHE_SIGNING_KEY": "fleet-secret"}
    # Node A compiles (Dynamo traces, Inductor compiles) and exits; kcache saves its package at exit.
    a = run_node(Node(tmp_path / "a"), **fleet)
    assert a["precompile"] and a["dynamo_cache"] == {"dynamo_cache_miss": 1}
    assert a["stats"]["dynamo"]["puts"] == 1 and a["stats"]["dynamo"]["put_errors"] == 0, a["stats"]
    assert not a["kcache_lines"], a["kcache_lines"]
    assert list((tmp_path / "a" / "tmp").glob("torchinductor_*/dynamo/*/entry")), "torch's own local copy"

    client = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))
    view = client.get_json("/v1/default/workloads/precompiled")
    keys = [e["key"] for e in view["entries"] if e["layer"] == "dynamo"]
    assert len(keys) == 1 and keys[0].startswith("pt2-precompile-v2:")
    stored, compile_time = client.get_entry("dynamo", keys[0])
    assert is_signed(stored)  # signed, like every entry of a fleet with a signing key
    # What the package replaces, measured by its producer, travels with it (and is the entry's compile time).
    package = dynamo_entries.decode(envelope.parse(stored).payload())
    assert package.compile_s is not None and package.compile_s > 0 and compile_time == pytest.approx(package.compile_s, abs=1e-3)
    assert str(tmp_path).encode() not in keys[0].encode()

    # Node B: new HOME and TMPDIR (another machine), same workload: the package arrives by the
    # prefetch (or the service), torch loads it: no Dynamo trace, no FX-graph or AOTAutograd lookup.
    b = run_node(Node(tmp_path / "b"), **fleet)
    assert b["dynamo_cache"] == {"dynamo_cache_hit": 1}, b["stderr"][-3000:]
    assert b["fx_graph"] == {} and b["aot_autograd"] == {}
    assert (b["out"], b["grad"]) == (a["out"], a["grad"])
    assert b["stats"]["dynamo"]["hits"] == 1 and b["stats"]["dynamo"]["errors"] == 0
    assert b["stats"]["dynamo"]["puts"] == 0  # the fleet has it: nothing to hand back
    assert not b["kcache_lines"], b["kcache_lines"]
    # It paid (loading it took less than compiling it took A, and Dynamo did not trace again):
    # still served to the next node.
    assert "unprofitable" not in _verification(Node(tmp_path / "b"))
    assert client.get_entry("dynamo", keys[0])[0] == stored

    # Node C: served the same, then a later call with another batch size, so Dynamo traces
    # forward again (new shapes, work a node does with or without the package). The package
    # served C's first step: it paid, and stays served (before kcache watched which frames a
    # package served, this retrace took it out of the fleet).
    c = run_node(Node(tmp_path / "c"), DYNAMO_JOB_THEN_BATCH="4", **fleet)
    assert c["dynamo_cache"] == {"dynamo_cache_hit": 1} and (c["out"], c["grad"]) == (a["out"], a["grad"])
    assert c["then_shape"] == [4, 4] and c["fx_graph"], "the later call compiled"
    assert not c["kcache_lines"], c["kcache_lines"]
    assert "unprofitable" not in _verification(Node(tmp_path / "c"))
    assert c["stats"]["dynamo"]["puts"] == 0 and c["stats"]["dynamo"]["errors"] == 0, c["stats"]["dynamo"]
    assert client.get_entry("dynamo", keys[0])[0] == stored


def _install(url: str, tmp_path: Path, mode: str = "readonly") -> Any:
    import kcache
    from kcache.current import get_runtime

    assert kcache.install(url=url, local_dir=str(tmp_path / "local"), mode=mode, layers="dynamo")
    return get_runtime()


@pytest.fixture
def precompile_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dynamo's precompile cache switched on in this process; kcache uninstalled afterwards."""
    import kcache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    try:
        with torch._dynamo.config.patch(caching_precompile=True):
            yield
    finally:
        kcache.uninstall()


def _f(x: Any) -> Any:
    return x.sin() + 1


# At module level: torch refuses to package a class defined in a function ("defined in local
# scope"). Of their own, because torch keeps one package per (qualname, line) in a process.
class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 4, bias=False)

    def forward(self, x: Any) -> Any:
        return self.proj(x)


def _double(x: Any) -> Any:
    return x * 2


@needs_packages
def test_the_key_follows_what_the_package_depends_on(live_service, precompile_on: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile`` asks DynamoCache for a package when it wraps a function (no compile
    here): kcache asks the service (a miss) under a key made of what must match. The same
    function and options ask one key; another mode, another model shape, another GPU do not."""
    from kcache.layers.dynamo import packages as dynamo_cache
    from kcache.store import fingerprint

    rt = _install(live_service.url, tmp_path)
    asked: list[str] = []

    def spy(fn: Any) -> str:
        asked.append(real(fn))
        return asked[-1]

    real = dynamo_cache.service_key
    monkeypatch.setattr(dynamo_cache, "service_key", spy)

    def key_asked(fn: Any, **options: Any) -> str:
        del asked[:]
        torch.compile(fn, **options)
        assert len(asked) == 1, asked
        return asked[0]

    first = key_asked(_f)
    assert first.startswith("pt2-precompile-v2:") and key_asked(_f) == first
    assert key_asked(_f, mode="max-autotune-no-cudagraphs") != first
    assert key_asked(torch.nn.Linear(4, 4)) != key_asked(torch.nn.Linear(4, 8))

    monkeypatch.setenv("KCACHE_GPU_ARCH", "sm_90")
    fingerprint.current.cache_clear()
    try:
        assert key_asked(_f) != first
    finally:
        monkeypatch.delenv("KCACHE_GPU_ARCH")
        fingerprint.current.cache_clear()
    # torch keeps one package per source id (qualname, line): a second key for one id in a
    # process (another mode, shape or GPU) is ambiguous, and kcache stops serving that id.
    stats = rt.stats.snapshot()["dynamo"]
    assert stats.misses == 3 and stats.errors == 0, stats


def test_an_unsupported_torch_degrades_with_one_warning(live_service, precompile_on: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Where torch cannot (2.9-2.12: see ``_torch_serves_packages``), the job runs as it would
    without the dynamo layer, the other layers still serve, and kcache says so once."""
    import logging

    with caplog.at_level(logging.WARNING, logger="kcache"):
        _install(live_service.url, tmp_path)
        for _ in range(2):
            torch.compile(_f)
    warnings = [r.getMessage() for r in caplog.records if "layer dynamo not served" in r.getMessage()]
    assert len(warnings) == (0 if _torch_serves_packages() else 1), warnings


@needs_packages
def test_an_incomplete_package_is_neither_uploaded_nor_written_for_torch(live_service, precompile_on: None, tmp_path: Path) -> None:
    """A forward alone, then the job ends: AOTAutograd saves a training graph only once its
    backward compiles, so torch's package lacks it ("Backend not found") and marks that code
    bypassed. kcache's save at exit neither uploads it nor leaves it in torch's dir: torch 2.11
    fails to load such a package (``assert name not in scope`` in ``install_global``, seen on the
    H100), where without one it compiles."""
    from kcache.layers.dynamo import packages as dynamo_cache

    rt = _install(live_service.url, tmp_path, mode="readwrite")
    torch.compile(_double)(torch.randn(4))  # complete: an inference graph, saved at once
    torch.compile(Head())(torch.randn(2, 8))  # parameters need grad: a training graph, no backward
    dynamo_cache.save_pending()  # what Runtime.close runs at exit
    assert rt.uploader.flush(30)
    assert rt.stats.snapshot()["dynamo"].puts == 1  # _double's package only
    assert len(list((tmp_path / "inductor" / "dynamo").glob("*/entry"))) == 1


class _BrokenGuards:
    """Pickles as torch 2.11's broken guard state did: ``DefaultsSource`` rebuilt with too many
    arguments, so torch's ``load_guards_state`` raises ``TypeError`` (not a ``RuntimeError``,
    the only error torch.compile survives there)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        from torch._dynamo.source import DefaultsSource

        return DefaultsSource, (1, 2, 3, 4, 5)


def _unloadable_copy(package: bytes) -> bytes:
    """``package`` with every guard state replaced by one torch cannot unpickle, rebuilt with
    torch's own pickling (``DiskDynamoStore.write``: ``pickle.dumps`` of the entry)."""
    import pickle

    entry = pickle.loads(package)
    for code in entry.dynamo.codes:
        for guarded in code.guarded_codes:
            guarded.guards_state = pickle.dumps(_BrokenGuards())
    return pickle.dumps(entry)


def _replace_on_service(client: KcacheClient, key: str, data: bytes) -> None:
    """What a bad producer would have left: the entry under ``key`` is ``data`` (admin delete,
    then the write-once upload)."""
    from kcache_schemas import wire

    client.delete(wire.path(wire.ENTRY, namespace="default", layer="dynamo", key=key))
    assert client.put_entry("dynamo", key, data)


def _populate_and_break(live_service: Any, tmp_path: Path, fleet: dict[str, str]) -> tuple[dict[str, Any], KcacheClient, str]:
    a = run_node(Node(tmp_path / "a"), **fleet)
    assert a["stats"]["dynamo"]["puts"] == 1, a["stats"]
    client = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))
    view = client.get_json(f"/v1/default/workloads/{fleet['KCACHE_WORKLOAD']}")
    (key,) = [e["key"] for e in view["entries"] if e["layer"] == "dynamo"]
    good, _ = client.get_entry("dynamo", key)
    _replace_on_service(client, key, _unloadable_copy(dynamo_entries.decode(good).package))
    return a, client, key


def _verification(node: Node) -> dict[str, dict[str, int]]:
    return dict(json.loads((node.root / "stats.json").read_text()).get("verification", {}))


@needs_packages
@pytest.mark.slow
def test_a_package_torch_cannot_load_is_quarantined_and_the_job_goes_on(live_service, tmp_path: Path) -> None:
    """The package on the service is one torch cannot load (a guard state that raises TypeError
    when unpickled, as torch 2.11's did for a transformers BERT). The fresh node that fetches it
    exits 0 with the output of a compile, says so once, and the service takes the entry out of
    service: a third node never receives it. Before kcache checked packages, node B died."""
    from kcache.exceptions import Quarantined

    fleet = {"KCACHE_URL": live_service.url, "KCACHE_WORKLOAD": "precompiled-bad"}
    a, client, key = _populate_and_break(live_service, tmp_path, fleet)

    b = run_node(Node(tmp_path / "b"), **fleet)  # the prefetch brings the bad package
    assert (b["out"], b["grad"]) == (a["out"], a["grad"])
    assert b["dynamo_cache"] == {"dynamo_cache_miss": 1}, "torch never saw the bad package"
    assert len(b["kcache_lines"]) == 1 and "quarantined" in b["kcache_lines"][0], b["kcache_lines"]
    assert b["stats"]["dynamo"]["error_kinds"] == {"quarantined": 1}, b["stats"]["dynamo"]
    assert b["stats"]["dynamo"]["puts"] == 0 and b["stats"]["dynamo"]["put_errors"] == 0  # not handed back either
    (reason,) = _verification(Node(tmp_path / "b"))["quarantined"]
    assert reason.startswith("dynamo: TypeError: DefaultsSource.__init__()"), reason
    assert not list((tmp_path / "b" / "home" / ".cache" / "kcache" / "client" / "entries").glob("*/default/dynamo/*/*"))

    info = client.quarantine_info("dynamo", key)
    assert "DefaultsSource" in info.reason and info.entry is not None and info.reporter and info.reporter.startswith("kcache/")
    with pytest.raises(Quarantined):
        client.get_entry("dynamo", key)
    view = client.get_json("/v1/default/workloads/precompiled-bad")
    assert not [e for e in view["entries"] if e["layer"] == "dynamo"], "never prefetched again"

    c = run_node(Node(tmp_path / "c"), **fleet)  # a third node: never receives it, compiles
    assert (c["out"], c["grad"]) == (a["out"], a["grad"])
    assert c["dynamo_cache"] == {"dynamo_cache_miss": 1}
    assert c["stats"]["dynamo"]["hits"] == 0 and c["stats"]["dynamo"]["miss_reasons"] == {"quarantined": 1}, c["stats"]["dynamo"]
    # The service said quarantined: C neither saves the key's package at exit nor offers it (refused anyway).
    assert c["stats"]["dynamo"]["puts"] == 0 and c["stats"]["dynamo"]["put_errors"] == 0, c["stats"]["dynamo"]
    assert not list((tmp_path / "c" / "tmp").glob("torchinductor_*/dynamo/*/entry"))
    assert not c["kcache_lines"], c["kcache_lines"]


@needs_packages
@pytest.mark.slow
def test_torch_failing_on_a_package_kcache_supplied_compiles_as_on_a_miss(live_service, tmp_path: Path) -> None:
    """The check before torch is skipped (as for a failure it cannot foresee): torch raises
    ``TypeError`` installing the package, and kcache's wrapper around ``torch.compile`` resets the
    package and runs torch again, which compiles. A package of the user's own that torch cannot
    load stays torch's business: that job fails as it would without kcache."""
    fleet = {"KCACHE_URL": live_service.url, "KCACHE_WORKLOAD": "precompiled-bad"}
    a, client, key = _populate_and_break(live_service, tmp_path, fleet)

    skip_check = "import kcache.layers.dynamo.packages as d; d.unloadable = lambda *args, **kwargs: None"
    b = run_node(Node(tmp_path / "b"), prelude=skip_check, **fleet)
    assert (b["out"], b["grad"]) == (a["out"], a["grad"])
    assert b["dynamo_cache"] == {"dynamo_cache_hit": 1, "dynamo_cache_miss": 1}, "torch loaded it, failed, then compiled"
    assert len(b["kcache_lines"]) == 1 and "quarantined" in b["kcache_lines"][0], b["kcache_lines"]
    assert "DefaultsSource" in client.quarantine_info("dynamo", key).reason
    assert b["stats"]["dynamo"]["puts"] == 0  # its own package has the quarantined key: not offered again

    # Node A's own package, broken in torch's own dir: torch raises, with or without kcache.
    (entry,) = (tmp_path / "a" / "tmp").glob("torchinductor_*/dynamo/*/entry")
    entry.write_bytes(_unloadable_copy(entry.read_bytes()))
    env = Node(tmp_path / "a").env(TORCH_CACHING_PRECOMPILE="1", **fleet)
    proc = subprocess.run([sys.executable, str(JOB)], env=env, cwd=tmp_path / "a", capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 1 and "TypeError: DefaultsSource.__init__()" in proc.stderr, proc.stderr[-3000:]


def _quad(x: Any) -> Any:
    return x * 4


@needs_packages
def test_a_package_torch_cannot_load_is_not_uploaded(live_service, precompile_on: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Producer side: before a package torch writes is uploaded, its guard states are unpickled
    as torch's install would; one that fails stays in torch's own dir (the user's) and is not
    handed to the fleet, counted as a put error ``unloadable``, said once."""
    import logging

    import torch._dynamo.package as package
    from kcache.layers.dynamo import packages as dynamo_cache

    rt = _install(live_service.url, tmp_path, mode="readwrite")
    torch.compile(_double)(torch.randn(4))
    dynamo_cache.save_pending()  # torch writes _double's package; kcache checks and uploads it
    assert rt.uploader.flush(30) and rt.stats.snapshot()["dynamo"].puts == 1
    (good,) = (tmp_path / "inductor" / "dynamo").glob("*/entry")

    torch.compile(_quad)  # kcache learns the service key of _quad's package (a miss)
    quad_id = package.CompilePackage.source_id_from_fn(_quad)
    with caplog.at_level(logging.WARNING, logger="kcache"):
        package.DynamoCache._write_to_local_cache(_unloadable_copy(good.read_bytes()), quad_id)  # as torch writes one
    assert rt.uploader.flush(30)
    stats = rt.stats.snapshot()["dynamo"]
    assert stats.puts == 1 and stats.put_errors == 1 and stats.error_kinds == {"unloadable": 1}, stats
    assert (tmp_path / "inductor" / "dynamo" / quad_id / "entry").exists()  # torch's own copy stays
    said = [r.getMessage() for r in caplog.records if "cannot be loaded" in r.getMessage()]
    assert len(said) == 1 and "DefaultsSource" in said[0], said


def _triple(x: Any) -> Any:
    return x * 3


@needs_packages
def test_install_uninstall_install_is_a_fresh_process_for_the_dynamo_layer(live_service, precompile_on: None, tmp_path: Path) -> None:
    """install -> use -> uninstall -> install behaves like a fresh process: what the layer knew
    about packages (fetched from the service, handed over) belonged to the runtime that learned it.
    Runtime 1 uploads ``_triple``'s package to namespace ``a``, runtime 2 fetches it from ``a``,
    runtime 3 (namespace ``b``, empty) compiles it again and must upload it there. Failed before
    the layer's state moved into the runtime: its module sets survived ``uninstall()`` and
    runtime 3 took the package for one already stored ("fetched from kcache") and never sent it."""
    import shutil

    import kcache
    from kcache.current import get_runtime
    from kcache.layers.dynamo import packages as dynamo_cache

    def run(namespace: str, mode: str) -> Any:
        assert kcache.install(url=live_service.url, local_dir=str(tmp_path / f"local-{namespace}-{mode}"), mode=mode,
                              layers="dynamo", namespace=namespace)
        rt = get_runtime()
        torch._dynamo.reset()  # nothing compiled, nothing in torch's dir (torch keeps the packages it may save)
        shutil.rmtree(tmp_path / "inductor" / "dynamo", ignore_errors=True)
        torch.compile(_triple)(torch.randn(4))
        dynamo_cache.save_pending()  # what Runtime.close runs at exit
        if rt.uploader is not None:
            assert rt.uploader.flush(30)
        stats = rt.stats.snapshot()["dynamo"]
        kcache.uninstall()
        return stats

    try:
        produced = run("a", "readwrite")
        assert produced.puts == 1, produced
        fetched = run("a", "readonly")
        assert fetched.hits == 1, fetched
        fresh = run("b", "readwrite")
        assert fresh.misses == 1 and fresh.puts == 1, fresh
    finally:
        _forget_compiles()  # the next test's save would write _triple's package too


def _forget_compiles() -> None:
    from torch._dynamo.precompile_context import PrecompileContext

    torch._dynamo.reset()
    PrecompileContext.clear()  # the packages torch keeps to save: reset() leaves them


# ---- serve a package only where it pays (kcache.layers.dynamo.payoff) ------------------------------------


def _the_package_key(client: KcacheClient, workload: str) -> str:
    view = client.get_json(f"/v1/default/workloads/{workload}")
    (key,) = [e["key"] for e in view["entries"] if e["layer"] == "dynamo"]
    return str(key)


@needs_packages
@pytest.mark.slow
def test_a_package_dynamo_traces_again_is_served_to_no_other_node(live_service, tmp_path: Path) -> None:
    """A natural guard miss: node B runs the job with another batch size than the producer, so
    the package's shape guards fail and Dynamo traces the function again after kcache installed
    the package (the H100's Llama train step: 1.9 s to load, then 2.2 s of tracing). B's job is
    right (it compiles; before kcache kept Dynamo's names apart from the package's, torch 2.13
    raised ``AssertionError: Name '__builtins_dict___1' already exists in scope`` and the job
    died), B says once that the package did not pay, and the service takes it out of service:
    no other node receives it."""
    from kcache.exceptions import Quarantined

    fleet = {"KCACHE_URL": live_service.url, "KCACHE_WORKLOAD": "precompiled-retrace"}
    a = run_node(Node(tmp_path / "a"), **fleet)
    assert a["stats"]["dynamo"]["puts"] == 1, a["stats"]
    client = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))
    key = _the_package_key(client, "precompiled-retrace")

    b = run_node(Node(tmp_path / "b"), DYNAMO_JOB_BATCH="4", **fleet)
    assert b["dynamo_cache"] == {"dynamo_cache_hit": 1}, "torch loaded the package, then traced"
    assert len(b["out"]) == 4 * 4
    assert len(b["kcache_lines"]) == 1 and "did not pay" in b["kcache_lines"][0], b["kcache_lines"]
    assert b["stats"]["dynamo"]["errors"] == 0 and b["stats"]["dynamo"]["puts"] == 0, b["stats"]["dynamo"]
    (reason,) = _verification(Node(tmp_path / "b"))["unprofitable"]
    assert reason.startswith("dynamo: Dynamo traced forward again"), reason
    assert not list((tmp_path / "b" / "tmp").glob("torchinductor_*/dynamo/*/entry")), "not left for B's next process"
    # What `kcache stats` prints of B's stats file: the finding, under the rule's name.
    from kcache.reporting.report import format_text
    from kcache.store.counters import load_stats

    shown = format_text(load_stats(tmp_path / "b" / "stats.json"))
    assert "Did not pay (loaded slower than its producer compiled it, or Dynamo traced a frame it had not served)" in shown, shown

    # What the next node meets (a node's run against a quarantined package, saving and uploading
    # nothing for its key, is test_a_package_torch_cannot_load_is_quarantined_and_the_job_goes_on's).
    info = client.quarantine_info("dynamo", key)
    assert info.reason.startswith("does not pay: Dynamo traced forward again"), info.reason
    with pytest.raises(Quarantined):
        client.get_entry("dynamo", key)
    view = client.get_json("/v1/default/workloads/precompiled-retrace")
    assert not [e for e in view["entries"] if e["layer"] == "dynamo"], "never prefetched again"


@needs_packages
@pytest.mark.slow
def test_a_package_that_loads_slower_than_it_compiled_is_served_to_no_other_node(live_service, tmp_path: Path) -> None:
    """No package on a CPU loads slower than it compiles, so the producer's measurement is
    forced: node A's package goes back to the service saying compiling it took 1 ms (what a
    producer whose compile was that cheap would have recorded). Node B loads it (the job is
    right: the package is used, no FX-graph lookup), measures the load against those 1 ms, and
    takes the package out of service for the fleet."""
    fleet = {"KCACHE_URL": live_service.url, "KCACHE_WORKLOAD": "precompiled-slow-load"}
    a = run_node(Node(tmp_path / "a"), **fleet)
    client = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))
    key = _the_package_key(client, "precompiled-slow-load")
    stored = dynamo_entries.decode(client.get_entry("dynamo", key)[0])
    assert stored.compile_s is not None and stored.compile_s > 0.001
    _replace_on_service(client, key, dynamo_entries.encode(stored.package, 0.001))

    b = run_node(Node(tmp_path / "b"), **fleet)
    assert (b["out"], b["grad"]) == (a["out"], a["grad"])
    assert b["dynamo_cache"] == {"dynamo_cache_hit": 1} and b["fx_graph"] == {}, "the package was used"
    assert len(b["kcache_lines"]) == 1 and "did not pay" in b["kcache_lines"][0], b["kcache_lines"]
    (reason,) = _verification(Node(tmp_path / "b"))["unprofitable"]
    assert reason.startswith("dynamo: loading it took") and "its producer 0.00s" in reason, reason
    assert client.quarantine_info("dynamo", key).reason.startswith("does not pay: loading it took")


def test_the_package_envelope() -> None:
    """The producer's seconds travel inside the stored bytes; a plain pickle reads as unmeasured;
    a damaged envelope is refused (a ValueError: quarantined like a package torch cannot load)."""
    stored = dynamo_entries.encode(b"pickle", 2.5)
    assert dynamo_entries.decode(stored) == dynamo_entries.StoredPackage(b"pickle", 2.5)
    assert dynamo_entries.decode(b"\x80\x04plain") == dynamo_entries.StoredPackage(b"\x80\x04plain", None)
    for damaged in (stored[:10], stored.replace(b"2.5", b'"x"'), stored.replace(b"2.5", b"-10")):
        with pytest.raises(ValueError):
            dynamo_entries.decode(damaged)


def test_stats_keep_the_largest_torch_timers_the_document_holds() -> None:
    """A node that loads a Dynamo package and then traces again runs more distinct torch timers
    than the stats document holds (64): kcache wrote no stats at all there ("could not collect
    stats at exit"); now it keeps the largest."""
    from kcache.reporting.torch_phases import torch_phases
    from kcache.store.counters import Stats
    from torch._dynamo.utils import compilation_time_metrics

    added = {f"kcache_test_timer_{i}": [float(i + 1)] for i in range(70)}
    compilation_time_metrics.update(added)
    try:
        phases = torch_phases()
        assert len(phases) == 64 and phases["kcache_test_timer_69"] == 70.0
        stats = Stats()
        stats.set_phases(phases)
        assert stats.document().phases == phases
    finally:
        for name in added:
            compilation_time_metrics.pop(name, None)
