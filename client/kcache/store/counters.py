"""Per-process cache statistics: hits (with the tier that served each), misses (with reasons)
and errors per layer, bytes moved, time spent in kcache, and compile time saved.

Errors are counted apart from misses everywhere: a service that is down must show up as errors,
not as a cold cache (bazel-remote #649, sccache #2820). The model and the arithmetic (hit rate,
merging) are the schemas' (:mod:`kcache_schemas.stats_document`), shared with the reports and the
service's runs; this module counts, and reads and writes ``KCACHE_STATS_FILE``.

At exit a process's counters become a :class:`StatsDocument` written to ``KCACHE_STATS_FILE``.
Documents merge by adding up, so many ranks can share one file (merged under a lock, replaced
atomically) or one directory (a file per process, merged on read).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache_schemas.key_diff import MAX_MISS_RECORDS, MissRecord
from kcache_schemas.stats_document import LayerCounts, StatsDocument
from pydantic import ValidationError

DIR_FILE_PREFIX = "kcache-stats-"


@dataclass
class _Tally:
    """One layer's running counts (mutable, under the Stats lock); :meth:`counts` is the model."""

    hits: int = 0
    misses: int = 0
    errors: int = 0
    puts: int = 0
    put_errors: int = 0
    skipped: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0
    saved_s: float = 0.0
    miss_reasons: Counter[str] = field(default_factory=Counter)
    error_kinds: Counter[str] = field(default_factory=Counter)
    served_by: Counter[str] = field(default_factory=Counter)

    def counts(self) -> LayerCounts:
        return LayerCounts(
            hits=self.hits, misses=self.misses, errors=self.errors, puts=self.puts, put_errors=self.put_errors,
            skipped=self.skipped, bytes_down=self.bytes_down, bytes_up=self.bytes_up,
            seconds=round(self.seconds, 6), saved_s=round(self.saved_s, 6),
            miss_reasons=dict(self.miss_reasons), error_kinds=dict(self.error_kinds), served_by=dict(self.served_by),
        )


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layers: defaultdict[str, _Tally] = defaultdict(_Tally)
        self._missed: dict[tuple[str, str], MissRecord] = {}
        self._verification: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._phases: dict[str, float] = {}
        self.started_at = time.time()

    def hit(self, layer: str, nbytes: int = 0, saved_s: float = 0.0, served_by: str | None = None) -> None:
        """A hit, with the tier that served it (``wire.ServedBy``; :mod:`kcache.store.tiered_store`)."""
        with self._lock:
            s = self._layers[layer]
            s.hits += 1
            s.bytes_down += nbytes
            s.saved_s += saved_s
            if served_by is not None:
                s.served_by[served_by] += 1

    def miss(self, layer: str, reason: str = "not_found") -> None:
        with self._lock:
            s = self._layers[layer]
            s.misses += 1
            s.miss_reasons[reason] += 1

    def error(self, layer: str, kind: str) -> None:
        with self._lock:
            s = self._layers[layer]
            s.errors += 1
            s.error_kinds[kind] += 1

    def put(self, layer: str, nbytes: int) -> None:
        with self._lock:
            s = self._layers[layer]
            s.puts += 1
            s.bytes_up += nbytes

    def put_error(self, layer: str, kind: str) -> None:
        with self._lock:
            s = self._layers[layer]
            s.put_errors += 1
            s.error_kinds[kind] += 1

    def skipped(self, layer: str, reason: str) -> None:
        with self._lock:
            s = self._layers[layer]
            s.skipped += 1
            s.miss_reasons[reason] += 1

    def missed(self, layer: str, key: str, reason: str = "not_found") -> None:
        """A lookup that missed locally and remotely, kept (bounded) for ``kcache explain``."""
        with self._lock:
            if len(self._missed) < MAX_MISS_RECORDS:
                self._missed.setdefault((layer, key), MissRecord(layer=layer, key=key[:512], reason=reason[:128]))

    def verify(self, kind: str, reason: str) -> None:
        """A post-install check's finding: ``fetched_unused``, ``emitted_then_compiled``, ``refused``."""
        with self._lock:
            self._verification[kind][reason[:128]] += 1

    def set_phases(self, phases: dict[str, float]) -> None:
        """Where start-up time went (torch's phase timers), read once at exit."""
        with self._lock:
            self._phases = dict(phases)

    @contextmanager
    def timed(self, layer: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._layers[layer].seconds += time.perf_counter() - t0

    def snapshot(self) -> dict[str, LayerCounts]:
        with self._lock:
            return {name: s.counts() for name, s in sorted(self._layers.items())}

    def document(self, **info: Any) -> StatsDocument:
        """This process's stats document; ``info`` adds run_id, workload, namespace, environment."""
        return StatsDocument(
            processes=1, host=socket.gethostname(), pid=os.getpid(), started_at=round(self.started_at, 3),
            ended_at=round(time.time(), 3), layers=self.snapshot(), missed=self.missed_records(),
            phases=self._phases, verification={kind: dict(c) for kind, c in sorted(self._verification.items())},
            **{k: v for k, v in info.items() if v is not None},
        )

    def missed_records(self) -> list[MissRecord]:
        with self._lock:
            return list(self._missed.values())


# ---- KCACHE_STATS_FILE ---------------------------------------------------------------------------


def stats_target(path: str | os.PathLike[str]) -> Path:
    """Where this process writes: ``<dir>/kcache-stats-<host>-<pid>.json`` if ``path`` is a
    directory (or ends with a separator), else ``path`` itself (shared, merged under a lock)."""
    raw = os.fspath(path)
    p = Path(raw).expanduser()
    if p.is_dir() or raw.endswith(("/", os.sep)):
        host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname())[:64]
        return p / f"{DIR_FILE_PREFIX}{host or 'host'}-{os.getpid()}.json"
    return p


_write_lock = threading.Lock()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``<path>.lock``; correctness of readers never depends on it
    (writes are atomic replaces), it only keeps concurrent read-modify-writes from losing counts."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): still atomic, merges may race
        yield
        return
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_document(path: Path) -> StatsDocument | None:
    try:
        return StatsDocument.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def write_stats(path: str | os.PathLike[str], doc: StatsDocument) -> Path:
    """Merge ``doc`` into the stats file at ``path`` (see :func:`stats_target`); returns the file.

    Read-modify-write under an exclusive lock, then an atomic ``os.replace``: readers see the old
    or the new document, never half of one, and concurrent writers never lose counts."""
    target = stats_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # A per-process file in a directory has one writer (this process): no lock file needed.
    per_process = target.name.startswith(DIR_FILE_PREFIX) and target != Path(path).expanduser()
    with _write_lock if per_process else _locked(target):
        existing = _read_document(target)
        if existing is not None:
            doc = StatsDocument.merge([existing, doc])
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(doc.model_dump_json(indent=1))
                f.write("\n")
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return target


def load_stats(path: str | os.PathLike[str]) -> StatsDocument:
    """The merged document of a stats file, or of every ``kcache-stats-*.json`` in a directory.

    Raises FileNotFoundError when there is nothing to read."""
    p = Path(path).expanduser()
    if p.is_dir():
        docs = [d for f in sorted(p.glob(f"{DIR_FILE_PREFIX}*.json")) if (d := _read_document(f)) is not None]
        if not docs:
            raise FileNotFoundError(f"no {DIR_FILE_PREFIX}*.json stats files in {p}")
        return StatsDocument.merge(docs)
    doc = _read_document(p)
    if doc is None:
        if not p.exists():
            raise FileNotFoundError(f"no stats file {p}")
        raise ValueError(f"{p} is not a kcache stats file")
    return StatsDocument.merge([doc])
