"""The test suite's compiler cache (kcache_testkit.compiler_cache) answers only a build it has
seen with the same inputs, and hands back exactly what the compiler wrote."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcache_testkit import compiler_cache

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SOURCE = '#include "answer.h"\nint answer(void) { return ANSWER; }\n'


@pytest.fixture
def cc(tmp_path: Path) -> tuple[Path, Path]:
    """(the wrapper dir, the cache dir), the wrappers installed as the suite installs them."""
    cache = tmp_path / "cache"
    return compiler_cache.install(tmp_path / "bin", cache), cache


def _build(bin_dir: Path, work: Path, answer: int, *extra: str) -> subprocess.CompletedProcess[str]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "answer.c").write_text(SOURCE)
    (work / "answer.h").write_text(f"#define ANSWER {answer}\n")
    return subprocess.run(
        [str(bin_dir / "gcc"), str(work / "answer.c"), "-include", str(work / "answer.h"), "-O1", "-shared", "-fPIC", *extra, "-o", str(work / "libanswer.so")],
        capture_output=True, text=True, cwd=work,
    )  # fmt: skip


def _log(cache: Path) -> list[str]:
    log = cache / "calls.log"
    return [line.split("\t")[1] for line in log.read_text().splitlines()] if log.exists() else []


def _answer(lib: Path) -> int:
    import ctypes

    return int(ctypes.CDLL(str(lib)).answer())


def test_the_same_build_in_another_dir_is_answered_from_the_cache(cc: tuple[Path, Path], tmp_path: Path) -> None:
    bin_dir, cache = cc
    assert _build(bin_dir, tmp_path / "node-a", 41).returncode == 0
    assert _build(bin_dir, tmp_path / "node-b", 41).returncode == 0
    assert _log(cache) == ["miss", "hit"]
    assert (tmp_path / "node-b" / "libanswer.so").read_bytes() == (tmp_path / "node-a" / "libanswer.so").read_bytes()
    assert _answer(tmp_path / "node-b" / "libanswer.so") == 41


def test_an_included_file_that_changed_is_compiled_again(cc: tuple[Path, Path], tmp_path: Path) -> None:
    """The header reaches the compiler by path (as Inductor's precompiled header does): its
    content is in the key, so a node with another header gets its own build."""
    bin_dir, cache = cc
    assert _build(bin_dir, tmp_path / "node-a", 41).returncode == 0
    assert _build(bin_dir, tmp_path / "node-b", 42).returncode == 0
    assert _build(bin_dir, tmp_path / "node-c", 41, "-O2").returncode == 0
    assert _log(cache) == ["miss", "miss", "miss"]
    assert _answer(tmp_path / "node-b" / "libanswer.so") == 42


def test_a_failed_build_is_not_stored(cc: tuple[Path, Path], tmp_path: Path) -> None:
    bin_dir, cache = cc
    for node in ("node-a", "node-b"):
        run = _build(bin_dir, tmp_path / node, 41, "-DANSWER_BROKEN", "-Werror", "-Wundef", "-include", "/nonexistent.h")
        assert run.returncode != 0 and "nonexistent" in run.stderr
        assert not (tmp_path / node / "libanswer.so").exists()
    assert _log(cache) == ["failed-1", "failed-1"]


def test_what_it_cannot_key_goes_straight_to_the_compiler(cc: tuple[Path, Path], tmp_path: Path) -> None:
    """Dependency files of a build that also links, and version probes: the real compiler, nothing stored."""
    bin_dir, cache = cc
    assert _build(bin_dir, tmp_path / "node-a", 41, "-MMD", "-MF", str(tmp_path / "node-a" / "deps.d")).returncode == 0
    assert (tmp_path / "node-a" / "deps.d").exists()
    version = subprocess.run([str(bin_dir / "gcc"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout == subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout
    assert _log(cache) == []


def _ninja_compile(bin_dir: Path, work: Path, include: Path, *extra: str, out: str = "x.o") -> subprocess.CompletedProcess[str]:
    """torch's extension JIT's compile (``$cxx -MMD -MF $out.d $cflags -c $in -o $out``) of a source
    that includes a header from a shared ``-I`` dir; ``out`` relative to ``work`` or absolute."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "src.cpp").write_text('#include "answer.h"\nint answer() { return ANSWER; }\n')
    return subprocess.run(
        [str(bin_dir / "g++"), "-MMD", "-MF", f"{out}.d", f"-I{include}", "-O1", "-fPIC", *extra, "-c", str(work / "src.cpp"), "-o", out],
        capture_output=True, text=True, cwd=work,
    )  # fmt: skip


@pytest.fixture
def include(tmp_path: Path) -> Path:
    include = tmp_path / "include"
    include.mkdir()
    (include / "answer.h").write_text("#define ANSWER 41\n")
    return include


def test_a_compile_with_a_depfile_elsewhere_gets_the_object_and_its_own_depfile(cc: tuple[Path, Path], tmp_path: Path, include: Path) -> None:
    """Neither the depfile's path nor the output's is in the key (each node builds in its own
    dir); the depfile comes back with the caller's output and source, so ninja's deps are right."""
    bin_dir, cache = cc
    a, b = tmp_path / "node-a", tmp_path / "node-b"
    assert _ninja_compile(bin_dir, a, include, out=str(a / "x.o")).returncode == 0
    assert _ninja_compile(bin_dir, b, include, out=str(b / "x.o")).returncode == 0
    assert _log(cache) == ["miss", "hit"]
    assert (b / "x.o").read_bytes() == (a / "x.o").read_bytes()
    deps = (b / "x.o.d").read_text()
    assert [w for w in deps.split() if w != "\\"] == [f"{b / 'x.o'}:", str(b / "src.cpp"), str(include / "answer.h")]
    assert str(a) not in deps and "\0" not in deps
    # What the compiler itself writes for node B's call.
    real = subprocess.run([_real("g++"), "-MMD", "-MF", "real.o.d", f"-I{include}", "-O1", "-fPIC", "-c", str(b / "src.cpp"), "-o", "real.o"], cwd=b)
    assert real.returncode == 0
    assert (b / "real.o").read_bytes() == (b / "x.o").read_bytes()
    assert (b / "real.o.d").read_text().replace("real.o", str(b / "x.o")) == deps


def _real(name: str) -> str:
    """The compiler itself, not a wrapper: the session's own (tests/conftest.py) come first on PATH."""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which(name, path=d) if d else None
        if found and b"compiler_cache" not in Path(found).read_bytes()[:4096]:
            return found
    raise AssertionError(f"no {name} on PATH")


def _ninja() -> str | None:
    return shutil.which("ninja") or shutil.which("ninja", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(_ninja() is None, reason="needs ninja")
def test_ninja_records_the_dependencies_of_a_compile_from_the_cache(cc: tuple[Path, Path], tmp_path: Path, include: Path) -> None:
    """ninja (``deps = gcc``) reads the depfile of a cached compile in another dir: nothing left to
    do on the next run, and a touched header builds again."""
    bin_dir, cache = cc
    ninja = str(_ninja())
    assert _ninja_compile(bin_dir, tmp_path / "node-a", include).returncode == 0
    c = tmp_path / "node-c"
    c.mkdir()
    (c / "build.ninja").write_text(
        "rule cxx\n"
        f"  command = {bin_dir / 'g++'} -MMD -MF $out.d -I{include} -O1 -fPIC -c $in -o $out\n"
        "  depfile = $out.d\n"
        "  deps = gcc\n"
        f"build x.o: cxx {c / 'src.cpp'}\n"
    )
    (c / "src.cpp").write_text((tmp_path / "node-a" / "src.cpp").read_text())

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([ninja, *args], capture_output=True, text=True, cwd=c)

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    assert _log(cache) == ["miss", "hit"]
    assert (c / "x.o").read_bytes() == (tmp_path / "node-a" / "x.o").read_bytes()
    assert not (c / "x.o.d").exists()  # read into .ninja_deps and deleted
    recorded = run("-t", "deps", "x.o").stdout
    assert str(c / "src.cpp") in recorded and str(include / "answer.h") in recorded, recorded
    assert "no work to do" in run().stdout
    later = time.time() + 10
    os.utime(include / "answer.h", (later, later))
    again = run()
    assert again.returncode == 0 and "no work to do" not in again.stdout, again.stdout
    assert _log(cache) == ["miss", "hit", "hit"]


def test_a_depfile_compile_with_a_path_gcc_would_escape_is_not_stored(cc: tuple[Path, Path], tmp_path: Path, include: Path) -> None:
    bin_dir, cache = cc
    work = tmp_path / "node a"
    for _ in range(2):
        assert _ninja_compile(bin_dir, work, include, out=str(work / "x.o")).returncode == 0
        assert (work / "x.o").exists() and (work / "x.o.d").read_text().startswith(f"{tmp_path}/node\\ a/x.o:")
    assert _log(cache) == [] and not list(cache.glob("??/*"))


def test_a_depfile_compile_with_a_header_beside_its_source_is_not_stored(cc: tuple[Path, Path], tmp_path: Path, include: Path) -> None:
    """A header found next to the source is in no key (only -I dirs and arguments are): its
    build is compiled each time, as before."""
    bin_dir, cache = cc
    for answer in (41, 42):
        work = tmp_path / f"node-{answer}"
        work.mkdir()
        (work / "answer.h").write_text(f"#define ANSWER {answer}\n")
        assert _ninja_compile(bin_dir, work, tmp_path / "empty").returncode == 0
    assert _log(cache) == ["unstored", "unstored"] and not list(cache.glob("??/*"))


def test_a_depfile_with_another_target_goes_straight_to_the_compiler(cc: tuple[Path, Path], tmp_path: Path, include: Path) -> None:
    bin_dir, cache = cc
    for node in ("node-a", "node-b"):
        assert _ninja_compile(bin_dir, tmp_path / node, include, "-MT", "other.o").returncode == 0
        assert (tmp_path / node / "x.o.d").read_text().startswith("other.o:")
    assert _ninja_compile(bin_dir, tmp_path / "node-c", include, "-MQ$(x)").returncode == 0
    assert _log(cache) == [] and not list(cache.glob("??/*"))


def test_prune_keeps_the_most_recently_used(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for i, name in enumerate(["aa/old", "bb/mid", "cc/new"]):
        path = cache / name
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    lines = [f"{i}\thit\t0.001\tg++ -c x.cpp\n" for i in range(100)]
    (cache / "calls.log").write_text("".join(lines))
    compiler_cache.prune(cache, max_bytes=250, max_log_bytes=1000)
    assert sorted(p.name for p in cache.glob("??/*")) == ["mid", "new"]
    # The call log grew by a line per compiler run without end (~100 KB a suite run): cut to its newest lines.
    kept = (cache / "calls.log").read_text()
    kept_lines = kept.splitlines(keepends=True)
    assert len(kept) <= 500 and 10 < len(kept_lines) < 100 and kept_lines == lines[-len(kept_lines):]


def test_the_switch_is_read_strictly() -> None:
    assert compiler_cache.enabled({}) is True
    assert compiler_cache.enabled({compiler_cache.SWITCH: "0"}) is False
    with pytest.raises(ValueError, match=compiler_cache.SWITCH):
        compiler_cache.enabled({compiler_cache.SWITCH: "maybe"})
