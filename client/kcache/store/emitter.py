"""The verified atomic emitter: writes kernel dirs into a Triton cache dir safely.

Guarantees (DESIGN.md, "the emitter"):

* Nothing is written before the whole pack verified (names, sizes, sha256, group file form).
* The dir is staged complete in ``<cache>/tmp.kcache.<uuid>`` (same filesystem), ``[REPLACE]``
  substituted, the group file written last, then ``os.replace``-d into place: readers see a whole
  kernel dir or none (no cubin of one writer with metadata of another: vllm#52413, triton#11319).
* An existing complete, valid dir wins. An incomplete or corrupt one is renamed to
  ``quarantine.<key>.<uuid>`` (kept an hour from then, for inspection, then swept) and replaced.
  N processes emitting one kernel at once leave exactly one intact dir; correctness never depends
  on a lock (huggingface_hub's habit).
* Paths come only from the validated 52-char key and validated file names: a pack cannot make
  us write outside the cache dir.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from kcache_schemas import KernelManifest, PackError, PackLimits, normalize_kernel_key
from kcache_schemas.pack import DEFAULT_LIMITS, check_kernel_files, read_pack, substitute_dir

from kcache.store.kernel_dirs import local_target, target_matches

log = logging.getLogger("kcache.store.emitter")

STAGING_PREFIX = "tmp.kcache."
QUARANTINE_PREFIX = "quarantine."
_STALE_AFTER_S = 3600.0
# Triton's FileCacheManager creates the kernel dir first and writes the group file last. A dir
# without a group file younger than this may be a compile in progress: moving it would break that
# compile, so we leave it alone (it will become complete by itself).
_IN_PROGRESS_S = 120.0
_cleaned: set[str] = set()
# The first emit into a dir sweeps it; emits from other threads of this process (Inductor's
# read_and_emit hook uses a pool) wait for that sweep rather than quarantine beside it.
_sweep_lock = threading.Lock()
# Shared objects in a Triton cache dir are host modules that Triton loads into the process; a
# kernel dir never holds one. They reach a node only as ``triton-module`` entries (signed where
# signing is configured, see kcache.transport.entry_signing): an (unsigned) kernel pack carrying one would
# bypass that.
NATIVE_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")


class EmitOutcome(str, enum.Enum):
    EMITTED = "emitted"  # we wrote the dir
    EXISTING = "existing"  # a complete, valid dir was already there (kept)
    REPAIRED = "repaired"  # a corrupt/incomplete dir was quarantined and replaced
    SKIPPED_TARGET = "skipped_target"  # built for another GPU than the local one
    BUSY = "busy"  # a young dir without its group file: a local compile is still writing it


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_complete(kernel_dir: Path, manifest: KernelManifest) -> bool:
    """Would Triton load this dir, and does it hold this kernel's binaries?

    The group file must parse and list every child at its path inside this dir, each present.
    Non-JSON files must match the manifest's sha256 (a corrupt cubin is caught). JSON files need
    only parse: a locally compiled dir legitimately differs in machine-local fields
    (e.g. ``extern_libs`` paths) and is as good as ours.
    """
    try:
        group = json.loads((kernel_dir / manifest.group_file).read_bytes())
        children = group["child_paths"]
        expected = {f.name for f in manifest.files} - {manifest.group_file}
        if set(children) != expected:
            return False
        for child, path in children.items():
            if Path(path) != kernel_dir / child or not os.path.isfile(path):
                return False
        for f in manifest.files:
            data = (kernel_dir / f.name).read_bytes()
            if f.name.endswith(".json"):
                json.loads(data)
            elif _sha256(data) != f.sha256:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def looks_emitted(cache_dir: str | os.PathLike[str], key: str, files: Mapping[str, bytes]) -> bool:
    """Cheap check for bundles re-read on a node that already has their kernels: every file of
    the dir is there, binaries at their size (JSON files hold this node's paths, so differ).

    A local warm start re-reads ~135 kernel dirs of a max-autotune graph; hashing them all again
    (``is_complete``) cost 0.4 s on an H100 node. Inductor's own ``read_and_emit`` checks less
    (a non-empty dir). Anything missing or of another size takes the verified path."""
    try:
        kernel_dir = os.path.join(cache_dir, normalize_kernel_key(key))
        for name, data in files.items():
            if "/" in name or name.startswith("."):
                return False  # the verified path refuses such names
            size = os.stat(os.path.join(kernel_dir, name)).st_size
            if not name.endswith(".json") and size != len(data):
                return False
        return bool(files)
    except (OSError, ValueError):
        return False


def whole_by_pack(cache_dir: str | os.PathLike[str], key: str, pack: bytes) -> bool:
    """The kernel dir is whole by this pack's manifest (the pack verified first): that build of
    the kernel is on disk. Checked only where a dir of the key exists (the pack is read whole)."""
    kernel_dir = Path(cache_dir) / normalize_kernel_key(key)
    if not kernel_dir.is_dir():
        return False
    try:
        manifest, _files = read_pack(pack)
    except PackError:
        return False
    return manifest.key == normalize_kernel_key(key) and is_complete(kernel_dir, manifest)


def _is_empty(path: Path) -> bool:
    try:
        return not any(os.scandir(path))
    except OSError:
        return False


def _judge_existing(cache: Path, final: Path, manifest: KernelManifest) -> EmitOutcome | None:
    """EXISTING (keep it), BUSY (leave it), or None after quarantining it (replace it)."""
    if is_complete(final, manifest):
        return EmitOutcome.EXISTING
    if _maybe_in_progress(final, manifest):
        return EmitOutcome.BUSY
    _quarantine(cache, final, manifest.key)
    return None


def _maybe_in_progress(kernel_dir: Path, manifest: KernelManifest) -> bool:
    try:
        young = time.time() - kernel_dir.stat().st_mtime < _IN_PROGRESS_S
    except OSError:
        return False
    return young and not (kernel_dir / manifest.group_file).exists()


def _quarantine(cache_dir: Path, kernel_dir: Path, key: str) -> None:
    dest = cache_dir / f"{QUARANTINE_PREFIX}{key}.{uuid.uuid4().hex[:12]}"
    with contextlib.suppress(FileNotFoundError):  # someone else moved it first: fine
        os.rename(kernel_dir, dest)
        # rename keeps the leftover's mtime (often hours old): the sweep's hour counts from now,
        # or the next sweep would delete the quarantined dir the warning below points at.
        os.utime(dest)
        log.warning("kcache: quarantined incomplete or corrupt kernel dir %s -> %s", kernel_dir, dest.name)


def clean_stale(cache_dir: Path, older_than_s: float = _STALE_AFTER_S) -> int:
    """Remove staging dirs (ours and Inductor's ``tmp.<uuid>``) and quarantined dirs left by
    crashed writers. Only old ones: a young one may belong to a writer still running."""
    removed = 0
    cutoff = time.time() - older_than_s
    try:
        entries = list(os.scandir(cache_dir))
    except OSError:
        return 0
    for entry in entries:
        if not (entry.name.startswith("tmp.") or entry.name.startswith(QUARANTINE_PREFIX)):
            continue
        try:
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    return removed


def _write_new(path: str, data: bytes) -> None:
    """``Path.write_bytes`` without the io stack (same flags and mode): bulk pulls write
    thousands of small files, and the buffered-file layers were a visible part of the cost."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def emit_files(
    cache_dir: str | os.PathLike[str],
    manifest: KernelManifest,
    files: Mapping[str, bytes],
    *,
    check_target: bool = True,
    verified: bool = False,
) -> EmitOutcome:
    """Emit one kernel dir whose files are in ``[REPLACE]`` form. Raises PackError if unsafe."""
    native = [f.name for f in manifest.files if f.name.lower().endswith(NATIVE_SUFFIXES) or ".so." in f.name.lower()]
    if native:
        raise PackError(f"kernel {manifest.key} carries a host module ({native[0]}); kernel dirs never hold native code")
    if not verified:
        check_kernel_files(manifest, files)
    key = normalize_kernel_key(manifest.key)  # 52 chars of [A-Z2-7]: safe as a path component
    if check_target and not target_matches(manifest.target, local_target()):
        return EmitOutcome.SKIPPED_TARGET
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    if str(cache) not in _cleaned:
        with _sweep_lock:
            if str(cache) not in _cleaned:
                clean_stale(cache)
                _cleaned.add(str(cache))
    final = cache / key

    repaired = False
    # An empty dir (Triton's FileCacheManager creates the dir before it looks for the group) is
    # simply replaced by the rename below; anything else is judged first.
    if final.exists() and not _is_empty(final):
        verdict = _judge_existing(cache, final, manifest)
        if verdict is not None:
            return verdict
        repaired = True

    staging = cache / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        contents = substitute_dir(files, str(final))
        prefix = f"{staging}{os.sep}"
        for f in manifest.files:  # manifest order; the group file last
            if f.name != manifest.group_file:
                _write_new(prefix + f.name, contents[f.name])
        _write_new(prefix + manifest.group_file, contents[manifest.group_file])
        for _attempt in range(3):
            try:
                os.rename(staging, final)  # atomic; fails if a non-empty dir is already there
                return EmitOutcome.REPAIRED if repaired else EmitOutcome.EMITTED
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            # A concurrent writer got there first. Theirs wins if it is whole (or still growing).
            verdict = _judge_existing(cache, final, manifest)
            if verdict is not None:
                return verdict
            repaired = True
        raise OSError(f"could not place {final}: it keeps being replaced by incomplete dirs")
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def emit_pack_manifest(
    cache_dir: str | os.PathLike[str],
    pack: bytes,
    *,
    expected_key: str | None = None,
    check_target: bool = True,
    limits: PackLimits = DEFAULT_LIMITS,
) -> tuple[EmitOutcome, KernelManifest]:
    """Verify pack bytes (from a server we do not trust), emit the kernel dir, and return the
    outcome with the pack's manifest (whose producer info credits compile time saved)."""
    manifest, files = read_pack(pack, limits)
    if expected_key is not None and manifest.key != normalize_kernel_key(expected_key):
        raise PackError(f"asked for kernel {expected_key} but the pack holds {manifest.key}")
    return emit_files(cache_dir, manifest, files, check_target=check_target, verified=True), manifest


def emit_pack(
    cache_dir: str | os.PathLike[str],
    pack: bytes,
    *,
    expected_key: str | None = None,
    check_target: bool = True,
    limits: PackLimits = DEFAULT_LIMITS,
) -> EmitOutcome:
    """Verify pack bytes (from a server we do not trust) and emit the kernel dir."""
    return emit_pack_manifest(cache_dir, pack, expected_key=expected_key, check_target=check_target, limits=limits)[0]
