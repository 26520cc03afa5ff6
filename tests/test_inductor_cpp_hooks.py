"""kcache's hooks on Inductor's C++ builds (kcache.layers.jit.inductor_cpp) in this process, on torch's real
modules: installed and removed with kcache, only when the ``jit`` layer is served, fail-open
around torch's own build, and no lookup for a module that is already there. The end-to-end
behaviour (real compiles, two nodes, a service) is tests/test_jit_inductor_cpp.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["live"]

torch = pytest.importorskip("torch")
import kcache  # noqa: E402
from kcache.current import get_runtime  # noqa: E402
from kcache.host import failopen  # noqa: E402
from torch._inductor import codecache, cpu_vec_isa  # noqa: E402

from kcache_testkit.ports import free_port  # noqa: E402

pytestmark = pytest.mark.torch


def _hooked() -> dict[str, bool]:
    return {
        "worker": codecache._worker_compile_cpp is not ORIGINALS["worker"],
        "load_library": codecache.CppCodeCache.__dict__["_load_library"] is not ORIGINALS["load_library"],
        "load_async": codecache.CppCodeCache.__dict__["load_async"] is not ORIGINALS["load_async"],
        "precompile": codecache._precompile_header is not ORIGINALS["precompile"],
        "check_build": cpu_vec_isa.VecISA.__dict__["check_build"] is not ORIGINALS["check_build"],
    }


ORIGINALS = {
    "worker": codecache._worker_compile_cpp,
    "load_library": codecache.CppCodeCache.__dict__["_load_library"],
    "load_async": codecache.CppCodeCache.__dict__["load_async"],
    "precompile": codecache._precompile_header,
    "check_build": cpu_vec_isa.VecISA.__dict__["check_build"],
}


@pytest.fixture
def dead_url() -> Iterator[str]:
    yield f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused at once
    kcache.uninstall()


class FakeBuilder:
    """What ``_worker_compile_cpp`` is given: a command line and a target; ``build`` writes it."""

    def __init__(self, target: Path, command: str | None = None) -> None:
        self.target, self.command, self.builds = target, command, 0

    def get_target_file_path(self) -> str:
        return str(self.target)

    def get_command_line(self) -> str:
        if self.command is None:
            raise RuntimeError("a shape kcache does not know")
        return self.command

    def build(self) -> None:
        self.builds += 1
        self.target.write_bytes(b"\x7fELF built by torch")


def test_the_hooks_come_and_go_with_kcache_and_the_layer(dead_url: str) -> None:
    assert not any(_hooked().values())
    assert kcache.install(url=dead_url)
    assert all(_hooked().values()), _hooked()
    kcache.uninstall()
    assert not any(_hooked().values()), _hooked()
    assert kcache.install(url=dead_url, layers="fx-graph,aot-autograd")
    assert not any(_hooked().values()), "KCACHE_LAYERS without jit leaves Inductor's builds alone"


def test_a_bug_of_ours_leaves_torchs_build_to_torch(dead_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(failopen, "_warned", set())
    assert kcache.install(url=dead_url, mode="readonly")
    builder = FakeBuilder(tmp_path / "cab.so")  # its command line raises in kcache's key
    with caplog.at_level("WARNING", logger="kcache"):
        codecache._worker_compile_cpp(str(tmp_path / "cab.lock"), (builder,))
    assert builder.builds == 1 and builder.target.read_bytes().startswith(b"\x7fELF")
    assert "Inductor C++ module lookup failed" in caplog.text


def test_a_dead_service_is_a_miss_and_torch_builds(dead_url: str, tmp_path: Path) -> None:
    assert kcache.install(url=dead_url, mode="readonly")
    source = tmp_path / "cab.cpp"
    source.write_text("int f() { return 1; }\n")
    builder = FakeBuilder(tmp_path / "cab.so", f"g++ {source} -shared -o {tmp_path / 'cab.so'}")
    codecache._worker_compile_cpp(str(tmp_path / "cab.lock"), (builder,))
    assert builder.builds == 1
    rt = get_runtime()
    assert rt is not None
    assert rt.stats.snapshot()["jit"].errors == 1  # counted apart from misses


def test_a_module_already_there_is_neither_looked_up_nor_built(dead_url: str, tmp_path: Path) -> None:
    assert kcache.install(url=dead_url)
    builder = FakeBuilder(tmp_path / "cab.so", "g++ never-run")
    builder.target.write_bytes(b"\x7fELF from an earlier run")
    codecache._worker_compile_cpp(str(tmp_path / "cab.lock"), (builder,))
    assert builder.builds == 0
    rt = get_runtime()
    assert rt is not None and "jit" not in rt.stats.snapshot()


def test_explain_names_the_flag_that_made_a_module_miss(live_service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two nodes build the same source, the second with another flag (in other dirs: paths are
    not part of the key): ``kcache explain`` names the command line, not the paths."""
    from kcache.config import ClientConfig
    from kcache.reporting.explanations import explain_key
    from kcache.store import fingerprint
    from kcache.transport.http import KcacheClient

    def build(node: str, flags: str) -> str:
        root = tmp_path / node
        root.mkdir()
        (root / "cab.cpp").write_text("int f() { return 1; }\n")
        assert kcache.install(url=live_service.url, workload="jit-explain")
        codecache._worker_compile_cpp(str(root / "cab.lock"), (FakeBuilder(root / "cab.so", f"g++ {root / 'cab.cpp'} {flags} -shared -o {root / 'cab.so'}"),))
        rt = get_runtime()
        assert rt is not None
        [missed] = [m for m in rt.stats.missed_records() if m.layer == "jit"]
        kcache.uninstall()  # uploads, publishes the workload
        return missed.key

    build("a", "-O3 -march=native")
    second = build("b", "-O2 -march=native")
    client = KcacheClient(ClientConfig(url=live_service.url))
    why = explain_key(client, "jit", second, workload="jit-explain", environment=fingerprint.current())
    assert [c.name for c in why.changes] == ["step0.command"], why.render()
    assert "-O3" in (why.changes[0].stored or "") and "-O2" in (why.changes[0].wanted or "")
