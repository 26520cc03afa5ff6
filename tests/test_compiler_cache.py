"""The test suite's compiler cache (kcache_testkit.compiler_cache) answers only a build it has
seen with the same inputs, and hands back exactly what the compiler wrote."""

from __future__ import annotations

import os
import shutil
import subprocess
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
    """Dependency files (ninja's -MMD -MF) and version probes: the real compiler, nothing stored."""
    bin_dir, cache = cc
    assert _build(bin_dir, tmp_path / "node-a", 41, "-MMD", "-MF", str(tmp_path / "node-a" / "deps.d")).returncode == 0
    assert (tmp_path / "node-a" / "deps.d").exists()
    version = subprocess.run([str(bin_dir / "gcc"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout == subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout
    assert _log(cache) == []


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
