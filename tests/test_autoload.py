"""Zero-code activation (``kcache_autoload.pth`` -> ``kcache._autoload``), in fresh interpreters.

At interpreter start the .pth imports only ``kcache`` and ``kcache._autoload``; nothing heavy
(httpx, pydantic, zstandard, torch) and no network. With ``KCACHE_URL`` set, kcache installs
itself right after ``torch._inductor.triton_bundler`` is first imported, not before.
``KCACHE_MODE=off`` and ``KCACHE_AUTOLOAD=0`` switch it off. Import-time cost is measured by
``bench/client_overhead.py``, not asserted here.
"""

from __future__ import annotations

import json
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcache_testkit.netfaults import FaultServer
from kcache_testkit.pace import HANG_S
from kcache_testkit.service import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.torch]

WATCHED = ("kcache", "kcache_schemas", "httpx", "pydantic", "zstandard", "torch", "triton")

# Prints which watched top-level packages are imported, at each step the probe takes.
PROBE = r"""
import json, os, sys

def state():
    mods = sorted(m for m in sys.modules if m.split(".")[0] in WATCHED)
    out = {"modules": mods, "env_manager": os.environ.get("TRITON_CACHE_MANAGER")}
    tb = sys.modules.get("torch._inductor.triton_bundler")
    if tb is not None:
        out["hooks"] = {n: getattr(tb.TritonBundler.__dict__[n], "__func__", None).__module__
                        for n in ("begin_compile", "put", "collect", "read_and_emit")}
    cc = sys.modules.get("triton.compiler.compiler")
    if cc is not None:
        out["key_hook"] = getattr(cc.get_cache_key, "__module__", None)
    if "kcache.current" in sys.modules:
        rt = sys.modules["kcache.current"].get_runtime()
        out["runtime_url"] = rt.config.url if rt else None
    return out

WATCHED = tuple(sys.argv[1].split(","))
steps = {"start": state()}
for step in sys.argv[2:]:
    __import__(step)
    steps[step] = state()
print("PROBE" + json.dumps(steps))
"""


def pth_installed() -> bool:
    return any((Path(d) / "kcache_autoload.pth").is_file() for d in site.getsitepackages())


@pytest.fixture(autouse=True)
def _needs_pth() -> None:
    if not pth_installed():
        pytest.skip("kcache_autoload.pth is not installed in this interpreter's site-packages")


def probe(tmp_path: Path, *imports: str, **env: str) -> dict[str, Any]:
    environ = clean_env(KCACHE_LOCAL_DIR=str(tmp_path / "kcache-local"), **env)
    environ.pop("TRITON_CACHE_MANAGER", None)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(WATCHED), *imports], capture_output=True, text=True, timeout=HANG_S, env=environ, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE"))
    out: dict[str, Any] = json.loads(line[len("PROBE"):])
    out["stderr"] = proc.stderr
    return out


def top(modules: list[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.fixture(scope="module")
def dead_url() -> Any:
    with FaultServer("refuse") as server:  # never contacted at start-up; refused if it were
        yield server.url


@pytest.mark.parametrize("url_set", [False, True], ids=["url-unset", "url-set"])
def test_interpreter_start_imports_only_the_autoload_module(tmp_path: Path, dead_url: str, url_set: bool) -> None:
    env = {"KCACHE_URL": dead_url} if url_set else {}
    out = probe(tmp_path, **env)
    assert out["start"]["modules"] == ["kcache", "kcache._autoload"]
    assert out["start"]["env_manager"] == ("kcache.triton_manager:KcacheCacheManager" if url_set else None)


def test_import_torch_alone_installs_nothing_until_the_bundler_is_imported(tmp_path: Path, dead_url: str) -> None:
    pytest.importorskip("torch")
    out = probe(tmp_path, "torch", "torch._inductor.triton_bundler", KCACHE_URL=dead_url)
    after_torch = out["torch"]
    assert "kcache.layers.inductor.triton_bundler" not in after_torch["modules"]
    assert not top(after_torch["modules"]) & {"httpx", "kcache_schemas"}, after_torch["modules"]

    after_bundler = out["torch._inductor.triton_bundler"]
    assert set(after_bundler["hooks"].values()) == {"kcache.layers.inductor.triton_bundler"}, after_bundler["hooks"]
    assert after_bundler["runtime_url"] == dead_url
    assert "httpx" in top(after_bundler["modules"])
    assert "Traceback" not in out["stderr"]


def test_a_triton_user_records_kernel_key_parts_and_a_local_hit_never_loads_the_client(tmp_path: Path, dead_url: str) -> None:
    """``import triton`` hooks Triton's key (for ``kcache explain``) cheaply; the cache manager,
    which Triton imports for every kernel it loads, brings no pydantic and no httpx."""
    pytest.importorskip("triton")
    out = probe(tmp_path, "triton", "kcache.triton_manager", KCACHE_URL=dead_url)
    after_triton = out["triton"]
    assert after_triton["key_hook"] == "kcache.layers.triton.kernel_key_parts"
    assert not top(after_triton["modules"]) & {"httpx", "pydantic", "kcache_schemas"}, after_triton["modules"]
    assert not top(out["kcache.triton_manager"]["modules"]) & {"httpx", "pydantic"}, out["kcache.triton_manager"]["modules"]
    assert "Traceback" not in out["stderr"]


@pytest.mark.parametrize(
    "env",
    [{"KCACHE_MODE": "off"}, {"KCACHE_MODE": "OFF"}, {"KCACHE_AUTOLOAD": "0"}, {}],
    ids=["mode-off", "mode-OFF", "autoload-0", "url-unset"],
)
def test_switched_off(tmp_path: Path, dead_url: str, env: dict[str, str]) -> None:
    pytest.importorskip("torch")
    if env:
        env = {"KCACHE_URL": dead_url, **env}
    out = probe(tmp_path, "torch._inductor.triton_bundler", **env)
    after = out["torch._inductor.triton_bundler"]
    assert set(after["hooks"].values()) == {"torch._inductor.triton_bundler"}, after["hooks"]
    assert top(after["modules"]) & {"httpx", "kcache_schemas"} == set(), after["modules"]
    assert [m for m in after["modules"] if m.startswith("kcache")] == ["kcache", "kcache._autoload"]
    assert after["env_manager"] is None


BOGUS_URL_SCRIPT = r"""
import sys
import torch._inductor.triton_bundler as tb
from kcache.current import get_runtime
assert tb.TritonBundler.__dict__["collect"].__func__.__module__ == "torch._inductor.triton_bundler"
from kcache.layers.triton import cache_manager as triton_manager
assert triton_manager._runtime() is None  # Triton's cache manager, if the user set it: local only
print("OK", get_runtime())
"""


@pytest.mark.parametrize("url", ["http://[not-a-host", "ftp://127.0.0.1:1", "not a url", "http://127.0.0.1:1/v1"])
def test_a_bogus_url_breaks_neither_the_import_nor_the_compile_path(tmp_path: Path, url: str) -> None:
    """A KCACHE_URL that is no service URL is a setting that does not parse: one warning naming it,
    kcache off (before: installed against it, every lookup an error)."""
    pytest.importorskip("torch")
    env = clean_env(KCACHE_URL=url, KCACHE_LOCAL_DIR=str(tmp_path / "kcache-local"))
    env.pop("TRITON_CACHE_MANAGER", None)
    proc = subprocess.run(
        [sys.executable, "-c", BOGUS_URL_SCRIPT, str(tmp_path / "triton")],
        capture_output=True, text=True, timeout=HANG_S, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["OK", "None"], (proc.stdout, proc.stderr[-2000:])
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("kcache:")]  # not paths that name kcache
    assert len(warnings) == 1 and f"KCACHE_URL={url!r}" in warnings[0] and "kcache is off" in warnings[0], proc.stderr[-2000:]
    assert not (tmp_path / "triton").exists()
