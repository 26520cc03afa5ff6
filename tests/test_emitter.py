"""The verified atomic emitter on real Triton kernels: Triton must accept what we write."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import triton
from kcache.cli.commands import main as cli
from kcache.store.emitter import EmitOutcome, clean_stale, emit_pack, is_complete
from kcache_schemas.pack import pack_kernel_dir, read_kernel_dir, read_pack

from kcache_testkit.corpus import _compile_env, cached_corpus, compile_small, corpus_specs
from kcache_testkit.kernels import triton_cache_hits
from kcache_testkit.pace import HANG_S

pytestmark = pytest.mark.torch

pytest_plugins = ["live"]




def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_push_then_pull_into_empty_dir_is_a_triton_cache_hit(live_service, real_kernel_dirs, tmp_path: Path) -> None:
    src = real_kernel_dirs[0].parent
    assert cli(["push", str(src), "--url", live_service.url]) == 0
    dest = tmp_path / "fresh-node"
    assert cli(["pull", "--all", "--dest", str(dest), "--url", live_service.url]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted(d.name for d in real_kernel_dirs)
    before = _tree(dest)

    hits = triton_cache_hits(lambda: compile_small(dest, count=len(real_kernel_dirs)))

    assert hits == [True] * len(real_kernel_dirs)  # Triton loaded every kernel from our dirs
    assert _tree(dest) == before  # and wrote nothing: no new dir, no rewritten file


def test_emitted_dir_is_byte_identical_after_replace(real_kernel_dirs, tmp_path: Path) -> None:
    for src in real_kernel_dirs:
        _manifest, pack = pack_kernel_dir(src)
        assert emit_pack(tmp_path, pack) is EmitOutcome.EMITTED
        emitted = tmp_path / src.name
        # Path-free forms are identical, and non-JSON files are identical byte for byte.
        assert read_kernel_dir(emitted) == read_kernel_dir(src)
        for f in src.iterdir():
            if not f.name.endswith(".json"):
                assert (emitted / f.name).read_bytes() == f.read_bytes()
        assert str(emitted).encode() in (emitted / f"__grp__{_manifest.kernel_name}.json").read_bytes()


def test_existing_valid_dir_is_kept(real_kernel_dirs, tmp_path: Path) -> None:
    _m, pack = pack_kernel_dir(real_kernel_dirs[0])
    emit_pack(tmp_path, pack)
    before = _tree(tmp_path)
    assert emit_pack(tmp_path, pack) is EmitOutcome.EXISTING
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("damage", ["flip_cubin", "drop_child", "garbage_group", "group_points_elsewhere"])
def test_corrupt_dir_is_quarantined_and_replaced(real_kernel_dirs, tmp_path: Path, damage: str) -> None:
    for other in real_kernel_dirs[1:]:
        emit_pack(tmp_path, pack_kernel_dir(other)[1])
    manifest, pack = pack_kernel_dir(real_kernel_dirs[0])
    emit_pack(tmp_path, pack)
    kdir = tmp_path / manifest.key
    name = manifest.kernel_name
    if damage == "flip_cubin":
        data = bytearray((kdir / f"{name}.cubin").read_bytes())
        data[100] ^= 0xFF
        (kdir / f"{name}.cubin").write_bytes(bytes(data))
    elif damage == "drop_child":
        (kdir / f"{name}.ptx").unlink()
    elif damage == "garbage_group":
        (kdir / f"__grp__{name}.json").write_text("{not json")
    else:
        grp = kdir / f"__grp__{name}.json"
        grp.write_text(grp.read_text().replace(str(kdir), "/nonexistent/dir"))
    assert not is_complete(kdir, manifest)

    assert emit_pack(tmp_path, pack) is EmitOutcome.REPAIRED

    assert is_complete(kdir, manifest)
    quarantined = [p for p in tmp_path.iterdir() if p.name.startswith("quarantine.")]
    assert len(quarantined) == 1  # the damaged dir is kept aside for inspection, not deleted
    assert triton_cache_hits(lambda: compile_small(tmp_path, count=len(real_kernel_dirs))) == [True] * len(real_kernel_dirs)


def test_dir_being_written_by_a_local_compile_is_left_alone(real_kernel_dirs, tmp_path: Path) -> None:
    manifest, pack = pack_kernel_dir(real_kernel_dirs[0])
    kdir = tmp_path / manifest.key
    kdir.mkdir()  # Triton's FileCacheManager makes the dir first and the group file last
    (kdir / f"{manifest.kernel_name}.ttir").write_text("partial")
    assert emit_pack(tmp_path, pack) is EmitOutcome.BUSY
    assert [p.name for p in kdir.iterdir()] == [f"{manifest.kernel_name}.ttir"]
    # ...but the same leftovers, an hour old, are a crashed writer's: repaired.
    old = time.time() - 7200
    os.utime(kdir, (old, old))
    assert emit_pack(tmp_path, pack) is EmitOutcome.REPAIRED


def test_an_old_leftover_once_quarantined_is_kept_an_hour_from_then(real_kernel_dirs, tmp_path: Path) -> None:
    # A crashed writer's leftover is hours old when kcache finds it; rename keeps that mtime, so the
    # next sweep (another thread's or process's first emit into this dir) used to delete the
    # quarantined dir at once: the evidence the warning points at was gone (CI stop 44).
    manifest, pack = pack_kernel_dir(real_kernel_dirs[0])
    kdir = tmp_path / manifest.key
    kdir.mkdir()
    (kdir / f"{manifest.kernel_name}.cubin").write_bytes(b"\0" * 10)
    old = time.time() - 7200
    os.utime(kdir, (old, old))
    assert emit_pack(tmp_path, pack) is EmitOutcome.REPAIRED
    assert clean_stale(tmp_path) == 0
    assert [p.name.startswith("quarantine.") for p in tmp_path.iterdir()].count(True) == 1


def test_threads_emitting_into_a_dir_never_sweep_a_quarantine_they_just_made(
    real_kernel_dirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inductor's read_and_emit hook emits a bundle's kernels from a thread pool: one thread runs the
    # dir's first sweep while another quarantines an old leftover. The sweep must finish first.
    import threading

    from kcache.store import emitter

    sweeping, release = threading.Event(), threading.Event()
    real_clean = emitter.clean_stale

    def slow_clean(cache_dir: Path, older_than_s: float = 3600.0) -> int:
        sweeping.set()
        release.wait(5)
        return real_clean(cache_dir, older_than_s)

    monkeypatch.setattr(emitter, "clean_stale", slow_clean)
    monkeypatch.setattr(emitter, "_cleaned", set())
    first, second = (pack_kernel_dir(d) for d in real_kernel_dirs[:2])
    leftover = tmp_path / second[0].key
    leftover.mkdir()
    (leftover / "junk.cubin").write_bytes(b"\0")
    past = time.time() - 7200
    os.utime(leftover, (past, past))
    outcomes: list[EmitOutcome] = []
    sweeper = threading.Thread(target=lambda: outcomes.append(emit_pack(tmp_path, first[1])))
    sweeper.start()
    assert sweeping.wait(5)
    other = threading.Thread(target=lambda: outcomes.append(emit_pack(tmp_path, second[1])))
    other.start()
    other.join(0.5)
    assert other.is_alive()  # waits for the sweep rather than racing it
    release.set()
    sweeper.join(5)
    other.join(5)
    assert sorted(o.value for o in outcomes) == ["emitted", "repaired"]
    assert [p.name.startswith("quarantine.") for p in tmp_path.iterdir()].count(True) == 1


def test_stale_staging_dirs_are_cleaned_young_ones_kept(tmp_path: Path) -> None:
    old, young = tmp_path / "tmp.kcache.old", tmp_path / "tmp.0b5e5f1e-young"
    for d in (old, young):
        d.mkdir()
        (d / "x.cubin").write_bytes(b"x")
    past = time.time() - 7200
    os.utime(old, (past, past))
    assert clean_stale(tmp_path) == 1
    assert not old.exists() and young.exists()


def test_kernel_for_another_gpu_is_skipped(real_kernel_dirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU on CI machines: pretend the local device is an A100 (sm_80); the kernel is sm_90.
    import kcache.store.emitter

    monkeypatch.setattr(kcache.store.emitter, "local_target", lambda: ("cuda", "80"))
    _m, pack = pack_kernel_dir(real_kernel_dirs[0])
    assert emit_pack(tmp_path, pack) is EmitOutcome.SKIPPED_TARGET
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(kcache.store.emitter, "local_target", lambda: ("cuda", "90"))
    assert emit_pack(tmp_path, pack) is EmitOutcome.EMITTED


_EMIT_ALL = textwrap.dedent(
    """
    import random, sys
    from pathlib import Path
    from kcache.store.emitter import emit_pack
    dest, packs, seed = Path(sys.argv[1]), sorted(Path(sys.argv[2]).iterdir()), int(sys.argv[3])
    random.Random(seed).shuffle(packs)
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for p in packs:
        emit_pack(dest, p.read_bytes())
        print("emitted", flush=True)  # lets a test kill us mid-run, whatever the speed
    """
)


def _write_packs(kernel_dirs: list[Path], out: Path) -> None:
    out.mkdir()
    for d in kernel_dirs:
        (out / f"{d.name}.kpack").write_bytes(pack_kernel_dir(d)[1])


@pytest.mark.slow
def test_16_processes_emitting_200_kernels_at_once_leave_intact_dirs(tmp_path: Path) -> None:
    corpus = cached_corpus(200)
    specs = corpus_specs(200)
    packs = tmp_path / "packs"
    kernel_dirs = sorted(p for p in corpus.iterdir() if len(p.name) == 52)
    _write_packs(kernel_dirs, packs)
    dest = tmp_path / "shared-cache"
    procs = [
        subprocess.Popen([sys.executable, "-c", _EMIT_ALL, str(dest), str(packs), str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for i in range(16)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        assert p.stdout is not None
        p.stdout.read()  # drain progress lines so no child blocks on a full pipe
        assert p.wait(timeout=HANG_S) == 0

    names = {p.name for p in dest.iterdir()}
    assert names == {d.name for d in kernel_dirs}  # no staging or quarantine leftovers
    for d in kernel_dirs:
        manifest, _files = read_pack((packs / f"{d.name}.kpack").read_bytes())
        assert is_complete(dest / d.name, manifest)
    before = _tree(dest)

    def compile_all() -> None:
        with _compile_env(dest):
            for spec in specs:
                triton.compile(spec.source(), target=spec.target(), options=spec.options())

    assert triton_cache_hits(compile_all) == [True] * len(specs)
    assert _tree(dest) == before


@pytest.mark.slow
def test_process_killed_mid_emit_leaves_no_partial_visible_dir(tmp_path: Path) -> None:
    corpus = cached_corpus(200)
    kernel_dirs = sorted(p for p in corpus.iterdir() if len(p.name) == 52)
    packs = tmp_path / "packs"
    _write_packs(kernel_dirs, packs)
    manifests = {d.name: read_pack((packs / f"{d.name}.kpack").read_bytes())[0] for d in kernel_dirs}
    rng = random.Random(7)
    for round_ in range(3):
        dest = tmp_path / f"cache-{round_}"
        p = subprocess.Popen([sys.executable, "-c", _EMIT_ALL, str(dest), str(packs), str(round_)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
        for _ in range(rng.randint(10, 120)):  # kill somewhere in the first ~60%
            assert p.stdout.readline()
        p.send_signal(signal.SIGKILL)
        p.wait()
        visible = [d for d in dest.iterdir() if not d.name.startswith(("tmp.", "quarantine."))]
        assert 0 < len(visible) < len(kernel_dirs), "kill should land mid-run; adjust timing"
        for d in visible:  # every dir Triton can see is whole
            assert is_complete(d, manifests[d.name]), d
        shutil.rmtree(dest)
