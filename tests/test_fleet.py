"""Fleet warm start on the CPU: torch's real Inductor caches and Triton's real cache lookups,
each "node" a fresh process with its own empty local caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kcache.config import ClientConfig
from kcache.store.fx_graph_envelope import MAGIC
from kcache.transport.http import KcacheClient

from kcache_testkit.pace import HANG_S
from kcache_testkit.service import with_testkit

pytest_plugins = ["live"]
pytest.importorskip("torch")

pytestmark = pytest.mark.torch
JOB = Path(__file__).with_name("fleet_job.py")
LAYERS = "fx-graph,aot-autograd"  # the layers a CPU compile exercises


def run_node(tmp: Path, name: str, url: str, **env: str) -> dict:  # type: ignore[type-arg]
    node = tmp / name
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TRITON_", "TORCHINDUCTOR_"))},
        "KCACHE_URL": url,
        "KCACHE_LAYERS": LAYERS,
        "KCACHE_LOCAL_DIR": str(node / "kcache-local"),
        "TORCHINDUCTOR_CACHE_DIR": str(node / "inductor"),  # a different path on every node
        "TRITON_CACHE_DIR": str(node / "triton"),
        "TRITON_DEFAULT_FP_FUSION": "1",
        **env,
    }
    proc = subprocess.run([sys.executable, str(JOB)], env=with_testkit(full_env), capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])  # type: ignore[no-any-return]


def run_job(script: str | Path, *args: str, **env: str) -> Any:
    """Run a Python job (source, or a file) as a fresh process that inherits no KCACHE_*/TRITON_*
    setting, and return the JSON on its last stdout line."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TRITON_"))}
    cmd = [sys.executable, str(script)] if isinstance(script, Path) else [sys.executable, "-c", script]
    out = subprocess.run([*cmd, *args], env=with_testkit({**base, **env}), capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def as_compile_worker(root: Path, script: str) -> Path:
    """Inductor runs its compile sidecar from torch/_inductor/compile_worker/__main__.py, which is
    how kcache tells such a process (killed without exit handlers) apart."""
    worker = root / "torch" / "_inductor" / "compile_worker" / "__main__.py"
    worker.parent.mkdir(parents=True)
    worker.write_text(script)
    return worker


@pytest.mark.slow
def test_fresh_node_gets_remote_hits_and_a_warmed_node_needs_no_network(live_service, tmp_path: Path) -> None:
    # Node A: empty service. Compiles everything, uploads kernels and Inductor entries,
    # publishes the workload manifest at exit.
    a = run_node(tmp_path, "a", live_service.url, KCACHE_WORKLOAD="resnet-ish")
    assert a["fx"].get("fxgraph_cache_miss") == 1 and not a["fx"].get("fxgraph_cache_hit")
    assert a["triton_cache_hits"] == [False] * 3
    assert a["stats"]["fx-graph"]["puts"] == 1 and a["stats"]["kernel"]["puts"] == 3
    assert a["stats"]["kernel"]["errors"] == 0

    # Nothing machine-local leaked into the kernels kcache packed: A's cache dirs, user or host.
    # (Inductor's own entries are its pickles, stored as Inductor made them: a compiled graph
    # carries a repro script, ``runnable_graph_str``, that names the producer's TORCH*/TRITON*
    # environment, cache dirs included, exactly as Inductor's Redis cache would store it.)
    client = KcacheClient(ClientConfig(url=live_service.url))
    stored = [client.get_pack(k) for k in a["kernel_keys"]]
    view = client.get_json("/v1/default/workloads/resnet-ish")
    assert {e["layer"] for e in view["entries"]} == {"fx-graph", "aot-autograd"}
    assert sorted(view["kernels"]) == sorted(a["kernel_keys"])
    import zstandard

    for blob in stored:
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(blob) if blob[:4] == b"\x28\xb5\x2f\xfd" else blob
        assert str(tmp_path / "a").encode() not in raw

    # The FX graph is stored as its raw pickle (kcache's envelope), not Inductor's base64 JSON.
    fx_entry = next(e for e in view["entries"] if e["layer"] == "fx-graph")
    assert client.get_entry("fx-graph", fx_entry["key"])[0].startswith(MAGIC)

    # Node B: different local cache dirs, no workload. Remote FX-graph + AOT hits (Inductor's own
    # counters), Triton kernel hits through kcache's cache manager, identical results; the graph
    # is unpickled from the envelope without Inductor's JSON decoding (which would raise there).
    b = run_node(tmp_path, "b", live_service.url, FORBID_FX_GRAPH_JSON="1")
    assert b["fx"].get("fxgraph_cache_hit") == 1 and not b["fx"].get("fxgraph_cache_miss")
    assert b["aot"].get("autograd_cache_hit") == 1
    assert b["triton_cache_hits"] == [True] * 3
    assert b["stats"]["kernel"]["hits"] == 3 and b["stats"]["fx-graph"]["hits"] == 1
    assert b["stats"]["fx-graph"]["saved_s"] > 0  # producer's compile time credited
    assert b["out"] == a["out"]

    # Node C: same workload name. The prefetcher, started at interpreter start, has every kernel
    # and every entry in the local tier before the first compile asks; it writes no Triton dir
    # (only the code that asks knows which dir is right), Triton's cache manager emits from the
    # local tier into its own dir on its local miss, without the network.
    c = run_node(tmp_path, "c", live_service.url, KCACHE_WORKLOAD="resnet-ish", PROBE_PREFETCH="1")
    assert c["prefetched_kernels"] == sorted(a["kernel_keys"])
    assert c["triton_dirs_before_compile"] == []
    assert c["prefetch_counts"]["entries"] == len(view["entries"])
    assert c["triton_cache_hits"] == [True] * 3
    assert c["stats"]["kernel"]["hits"] == 3 and c["stats"]["kernel"]["errors"] == 0
    assert c["fx"].get("fxgraph_cache_hit") == 1
    assert c["stats"]["fx-graph"]["errors"] == 0 and c["out"] == a["out"]

    # `kcache warm` ahead of time, then a node whose service is gone: no network needed at all.
    from kcache.cli.commands import main as cli

    d = tmp_path / "d"
    assert cli(["warm", "resnet-ish", "--url", live_service.url, "--local-dir", str(d / "kcache-local")]) == 0
    # The job names the same service it was warmed from (the local tier is per service URL), but
    # the service is gone: nothing listens there, and any network attempt would count an error.
    live_service.__exit__(None, None, None)
    offline = run_node(tmp_path, "d", live_service.url)
    assert offline["triton_cache_hits"] == [True] * 3
    assert offline["fx"].get("fxgraph_cache_hit") == 1
    assert all(layer["errors"] == 0 for layer in offline["stats"].values()), offline["stats"]
    assert offline["out"] == a["out"]


@pytest.mark.slow
def test_triton_manager_is_local_first(live_service, tmp_path: Path) -> None:
    """Unlike Triton's RemoteCacheManager, a local hit never touches the network."""
    script = (
        "import json,sys,triton\n"
        "from kcache_testkit.corpus import compile_small\n"
        "from kcache.current import get_runtime\n"
        "hits=[]; triton.knobs.compilation.listener=lambda *,cache_hit=False,**_: hits.append(cache_hit)\n"
        "compile_small(sys.argv[1], count=2)\n"
        "rt=get_runtime(); rt.close() if rt else None\n"
        "print(json.dumps({'hits': hits, 'stats': {n: c.model_dump() for n, c in rt.stats.snapshot().items()} if rt else None}))\n"
    )
    cache = tmp_path / "triton"

    def run(url: str) -> Any:
        return run_job(script, str(cache), KCACHE_URL=url, TRITON_CACHE_DIR=str(cache), TRITON_DEFAULT_FP_FUSION="1")

    first = run(live_service.url)  # compiles locally, uploads in the background
    assert first["hits"] == [False, False] and first["stats"]["kernel"]["puts"] == 2
    second = run("http://127.0.0.1:9")  # local hits; the (dead) service is never asked
    assert second["hits"] == [True, True]
    assert second["stats"] is None or all(v["errors"] == 0 and v["misses"] == 0 for v in second["stats"].values())


@pytest.mark.slow
def test_kernels_compiled_by_a_process_killed_without_exit_handlers_are_uploaded(live_service, tmp_path: Path) -> None:
    """Inductor terminates its compile workers (no atexit), so there the Triton manager must not
    leave uploads queued in the background."""
    script = (
        "import os,sys,json\n"
        "from kcache.transport.uploader import Uploader\n"
        "Uploader.submit = lambda self, item: False  # killed before a queued upload could run\n"
        "from kcache_testkit.corpus import compile_small\n"
        "dirs = compile_small(sys.argv[1], count=2)\n"
        "print(json.dumps([d.name for d in dirs]), flush=True)\n"
        "os._exit(0)  # like SIGTERM from ProcessPoolExecutor: no atexit, no flush\n"
    )
    cache = tmp_path / "worker-triton"
    worker = as_compile_worker(tmp_path, script)
    keys = run_job(worker, str(cache), KCACHE_URL=live_service.url, TRITON_CACHE_DIR=str(cache), TRITON_DEFAULT_FP_FUSION="1")
    assert KcacheClient(ClientConfig(url=live_service.url)).missing(keys) == []


# Triton builds its host-side helpers (cuda_utils, per-signature launchers) exactly like this:
# C source -> compile_module_from_src -> C compiler -> a .so kept in its cache dir under its key.
HOST_MODULE_SRC = r"""
#include <Python.h>
static PyObject* marker(PyObject* self, PyObject* args) { return PyLong_FromLong(4242); }
static PyMethodDef methods[] = {{"marker", marker, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "kcache_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_kcache_probe(void) { return PyModule_Create(&mod); }
"""
HOST_MODULE_JOB = """
import json, os, sys, time, triton
from triton.runtime.build import compile_module_from_src
if sys.argv[1] == "no-compiler":
    def no_compiler(*args, **kwargs):
        raise RuntimeError("the C compiler was called")
    triton.knobs.build.impl = no_compiler
if sys.argv[1] == "abrupt":  # the process will die before a queued upload could run: model that
    from kcache.transport.uploader import Uploader
    Uploader.submit = lambda self, item: False
module = compile_module_from_src(os.environ["PROBE_SRC"], "kcache_probe")
if sys.argv[1] == "abrupt":  # as Inductor ends its compile workers: no atexit, no flush
    print(json.dumps({"marker": module.marker()}), flush=True)
    os._exit(0)
from kcache.current import get_runtime
rt = get_runtime()
stats = None
if rt is not None:
    rt.close()
    counts = rt.stats.snapshot().get("triton-module")
    stats = counts.model_dump() if counts else None
print(json.dumps({"marker": module.marker(), "stats": stats}))
"""


def run_host_module_job(node: Path, url: str, mode: str, src: str, script: Path | None = None) -> Any:
    env = {"KCACHE_URL": url, "TRITON_CACHE_DIR": str(node / "triton"), "KCACHE_LOCAL_DIR": str(node / "local"), "PROBE_SRC": src}
    return run_job(script or HOST_MODULE_JOB, mode, **env)


@pytest.mark.slow
def test_triton_host_modules_are_shared_so_a_fresh_node_runs_no_c_compiler(live_service, tmp_path: Path) -> None:
    """A fresh node's first Triton launch builds ``cuda_utils`` and launcher stubs with gcc (~0.3 s
    each on an H100 node); kcache serves them like any other artifact."""

    def node(name: str, url: str, mode: str = "") -> Any:
        return run_host_module_job(tmp_path / name, url, mode, HOST_MODULE_SRC)

    producer = node("a", live_service.url)  # builds with the C compiler, uploads the .so
    assert producer["marker"] == 4242 and producer["stats"]["puts"] == 1 and producer["stats"]["misses"] == 1
    fresh = node("b", live_service.url, "no-compiler")  # Triton would raise if it called the compiler
    assert fresh["marker"] == 4242 and fresh["stats"]["hits"] == 1 and fresh["stats"]["errors"] == 0
    built = [p.read_bytes() for p in (tmp_path / "b" / "triton").rglob("kcache_probe*.so")]
    assert built == [p.read_bytes() for p in (tmp_path / "a" / "triton").rglob("kcache_probe*.so")]
    again = node("b", "http://127.0.0.1:9", "no-compiler")  # a local hit now: the service is not asked
    assert again["marker"] == 4242 and (again["stats"] is None or again["stats"]["errors"] == 0)
    offline = node("c", "http://127.0.0.1:9")  # service down, empty node: Triton builds it itself
    assert offline["marker"] == 4242


@pytest.mark.slow
def test_a_host_module_built_in_a_compile_worker_is_uploaded_before_the_worker_is_killed(live_service, tmp_path: Path) -> None:
    src = HOST_MODULE_SRC.replace("4242", "4343")  # another module: another key
    worker = as_compile_worker(tmp_path, HOST_MODULE_JOB)
    assert run_host_module_job(tmp_path / "worker", live_service.url, "abrupt", src, script=worker)["marker"] == 4343
    fresh = run_host_module_job(tmp_path / "fresh", live_service.url, "no-compiler", src)
    assert fresh["marker"] == 4343 and fresh["stats"]["hits"] == 1


def test_compile_worker_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.host.process_roles import in_inductor_compile_worker

    monkeypatch.setattr(sys, "argv", ["/venv/lib/python3.12/site-packages/torch/_inductor/compile_worker/__main__.py", "--pickler=x"])
    assert in_inductor_compile_worker()
    monkeypatch.setattr(sys, "argv", ["train.py"])
    assert not in_inductor_compile_worker()
    monkeypatch.setattr(sys, "argv", ["/home/me/compile_worker_notes/train.py"])
    assert not in_inductor_compile_worker()


def test_ls_workloads_shows_environment_fingerprints(live_service, capsys: pytest.CaptureFixture[str]) -> None:
    from kcache.cli.commands import main as cli
    from kcache.store.fingerprint import current
    from kcache.transport.workload import publish
    from kcache_schemas.models import EnvFingerprint

    client = KcacheClient(ClientConfig(url=live_service.url))
    publish(client, "llama-ft", set(), {("fx-graph", "pt2:fx-graph-v1::abc:c1")})
    # The same workload recorded in another environment is kept apart, and shown as such.
    other = EnvFingerprint(torch="2.11.0+cu130", triton="3.6.0", cuda="13.0", gpu_arch="sm_90")
    client.put_json(
        "/v1/default/workloads/llama-ft",
        json.dumps({"name": "llama-ft", "fingerprint": other.model_dump(), "entries": [{"layer": "fx-graph", "key": "pt2:x:c1"}]}),
    )
    assert cli(["ls", "--workloads", "--url", live_service.url]) == 0
    out = capsys.readouterr().out
    assert f"{current().id}" in out and "(this machine)" in out
    assert other.id in out and "torch 2.11.0+cu130" in out
    view = client.get_json("/v1/default/workloads/llama-ft", fingerprint=current().id)
    assert [e["key"] for e in view["entries"]] == ["pt2:fx-graph-v1::abc:c1"]  # environments stay apart
    assert [fp["torch"] for fp in view["other_fingerprints"]] == ["2.11.0+cu130"]


def test_workload_put_refuses_a_body_for_another_name(live_service) -> None:
    import httpx

    r = httpx.put(f"{live_service.url}/v1/default/workloads/a", json={"name": "b", "fingerprint": {}}, timeout=HANG_S)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert httpx.get(f"{live_service.url}/v1/default/workloads/a", timeout=HANG_S).status_code == 404  # nothing stored


def test_a_fetched_entry_reaches_the_local_tier_so_the_next_process_needs_no_network(
    live_service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local-tier copy of a fetched entry is written off the compile thread; it must still be
    complete when the process ends (no daemon thread cut short at exit)."""
    from kcache.runtime import Runtime

    blob = os.urandom(3_000_000)
    KcacheClient(ClientConfig(url=live_service.url)).put_entry("fx-graph", "pt2:fx-graph-v1::local-tier:c1", blob)
    script = (
        "import sys; from kcache.config import ClientConfig; from kcache.runtime import Runtime\n"
        "rt = Runtime(ClientConfig(url=sys.argv[1], mode='readonly'))\n"
        "fetched = len(rt.get_entry('fx-graph', 'pt2:fx-graph-v1::local-tier:c1') or b'')\n"
        "rt.close()\n"
        "print(fetched)\n"
    )
    assert run_job(script, live_service.url, KCACHE_LOCAL_DIR=str(tmp_path / "local"), KCACHE_AUTOLOAD="0") == 3_000_000
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path / "local"))
    live_service.__exit__(None, None, None)  # the same service, gone: nothing listens there now
    offline = Runtime(ClientConfig(url=live_service.url, mode="readonly"))
    assert offline.get_entry("fx-graph", "pt2:fx-graph-v1::local-tier:c1") == blob
    assert offline.stats.snapshot()["fx-graph"].errors == 0
    offline.close()
    # Another service's node never gets this service's entries from the shared tier.
    other = Runtime(ClientConfig(url="http://127.0.0.1:9", mode="readonly"))
    assert other.get_entry("fx-graph", "pt2:fx-graph-v1::local-tier:c1") is None
    other.close()


@pytest.mark.slow
def test_switching_kcache_on_or_off_keeps_inductors_local_cache_keys(live_service, tmp_path: Path) -> None:
    """kcache must not change what Inductor hashes into its keys (its config switches included):
    a node's local caches written without kcache hit with it, and the other way round."""
    without = run_node(tmp_path, "n", live_service.url, KCACHE_MODE="off")
    assert without["fx"].get("fxgraph_cache_miss") == 1 and without["stats"] is None
    with_kcache = run_node(tmp_path, "n", live_service.url)
    assert with_kcache["fx"].get("fxgraph_cache_hit") == 1 and not with_kcache["fx"].get("fxgraph_cache_miss")
    assert with_kcache["aot"].get("autograd_cache_hit") == 1
    assert with_kcache["stats"].get("fx-graph", {}).get("hits", 0) == 0  # a local hit: no service needed
    assert with_kcache["out"] == without["out"]
    # And back: without kcache again, the node still hits what it has.
    off_again = run_node(tmp_path, "n", live_service.url, KCACHE_MODE="off")
    assert off_again["fx"].get("fxgraph_cache_hit") == 1 and off_again["aot"].get("autograd_cache_hit") == 1
