"""Per-process cache statistics: hits, misses (with reasons) and errors per layer, bytes moved,
time spent in kcache, and compile time saved.

Errors are counted apart from misses everywhere: a service that is down must show up as errors,
not as a cold cache (bazel-remote #649, sccache #2820). Hit rate is
``hits / (hits + misses + errors)``: errors count against it and are shown on their own.

At exit a process's counters become a *stats document* (``{"format": "kcache-stats", "layers":
{...}, "processes": 1, ...}``) written to ``KCACHE_STATS_FILE``. Documents merge by adding up
(:func:`merge_documents`), so many ranks can share one file (merged under a lock, replaced
atomically) or one directory (a file per process, merged on read).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache_schemas.models import (
    EnvFingerprint,
    EnvironmentSummary,
    LayerCounts,
    hit_rate,
    summarize_environments,
)

STATS_FORMAT = "kcache-stats"
STATS_VERSION = 1
DIR_FILE_PREFIX = "kcache-stats-"


@dataclass
class LayerStats:
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "puts": self.puts,
            "put_errors": self.put_errors,
            "skipped": self.skipped,
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "seconds": round(self.seconds, 6),
            "saved_s": round(self.saved_s, 6),
            "miss_reasons": dict(self.miss_reasons),
            "error_kinds": dict(self.error_kinds),
        }


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.layers: defaultdict[str, LayerStats] = defaultdict(LayerStats)
        self.started_at = time.time()

    def hit(self, layer: str, nbytes: int = 0, saved_s: float = 0.0) -> None:
        with self._lock:
            s = self.layers[layer]
            s.hits += 1
            s.bytes_down += nbytes
            s.saved_s += saved_s

    def miss(self, layer: str, reason: str = "not_found") -> None:
        with self._lock:
            s = self.layers[layer]
            s.misses += 1
            s.miss_reasons[reason] += 1

    def error(self, layer: str, kind: str) -> None:
        with self._lock:
            s = self.layers[layer]
            s.errors += 1
            s.error_kinds[kind] += 1

    def put(self, layer: str, nbytes: int) -> None:
        with self._lock:
            s = self.layers[layer]
            s.puts += 1
            s.bytes_up += nbytes

    def put_error(self, layer: str, kind: str) -> None:
        with self._lock:
            s = self.layers[layer]
            s.put_errors += 1
            s.error_kinds[kind] += 1

    def skipped(self, layer: str, reason: str) -> None:
        with self._lock:
            s = self.layers[layer]
            s.skipped += 1
            s.miss_reasons[reason] += 1

    @contextmanager
    def timed(self, layer: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.layers[layer].seconds += time.perf_counter() - t0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {name: s.as_dict() for name, s in sorted(self.layers.items())}

    def document(self, **info: Any) -> dict[str, Any]:
        """This process's stats document (see the module doc); ``info`` adds run_id, workload, ..."""
        doc: dict[str, Any] = {
            "format": STATS_FORMAT,
            "version": STATS_VERSION,
            "processes": 1,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": round(self.started_at, 3),
            "ended_at": round(time.time(), 3),
        }
        doc.update({k: v for k, v in info.items() if v is not None})
        doc["layers"] = self.snapshot()
        return doc


# ---- arithmetic ---------------------------------------------------------------------------------

_COUNTS = ("hits", "misses", "errors", "puts", "put_errors", "skipped", "bytes_down", "bytes_up")
_TIMES = ("seconds", "saved_s")


def totals(layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Counters summed over layers, plus ``lookups`` and ``hit_rate``."""
    out: dict[str, Any] = {k: sum(int(v.get(k, 0)) for v in layers.values()) for k in _COUNTS}
    out.update({k: round(sum(float(v.get(k, 0.0)) for v in layers.values()), 6) for k in _TIMES})
    out["lookups"] = out["hits"] + out["misses"] + out["errors"]
    out["hit_rate"] = hit_rate(out["hits"], out["misses"], out["errors"])
    return out


def merge_layers(many: Iterable[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Add up per-layer counters (reasons too)."""
    merged: dict[str, dict[str, Any]] = {}
    for layers in many:
        for name, counts in layers.items():
            acc = merged.setdefault(name, LayerStats().as_dict())
            for key, value in counts.items():
                if isinstance(value, dict):
                    bucket = acc.setdefault(key, {})
                    for reason, n in value.items():
                        bucket[reason] = bucket.get(reason, 0) + int(n)
                elif key in _TIMES:
                    acc[key] = round(float(acc.get(key, 0.0)) + float(value), 6)
                elif isinstance(value, (int, float)):
                    acc[key] = acc.get(key, 0) + int(value)
    return dict(sorted(merged.items()))


def merge_documents(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One document for many: counters add up, ``processes`` counts every process merged in."""
    docs = [d for d in docs if isinstance(d, dict) and isinstance(d.get("layers"), dict)]
    merged: dict[str, Any] = {"format": STATS_FORMAT, "version": STATS_VERSION}
    merged["processes"] = sum(int(d.get("processes", 1)) for d in docs)
    starts = [float(d["started_at"]) for d in docs if d.get("started_at")]
    ends = [float(d["ended_at"]) for d in docs if d.get("ended_at")]
    merged["started_at"] = min(starts) if starts else None
    merged["ended_at"] = max(ends) if ends else None
    for key in ("run_id", "namespace"):
        values = sorted({str(d[key]) for d in docs if d.get(key)})
        merged[key] = values[0] if len(values) == 1 else None
    workloads = sorted({str(w) for d in docs for w in [d.get("workload"), *d.get("workloads", [])] if w})
    merged["workload"] = workloads[0] if len(workloads) == 1 else None
    merged["workloads"] = workloads
    merged["layers"] = merge_layers(d["layers"] for d in docs)
    merged["environments"] = [e.model_dump() for e in merge_environments(docs)]
    return merged


def _environments_of(doc: dict[str, Any]) -> list[EnvironmentSummary]:
    """A document's per-environment lookups: a merged one lists them, a process's own document
    has its ``environment`` (the fingerprint at exit) and its layers."""
    if isinstance(doc.get("environments"), list):
        return [EnvironmentSummary.model_validate(e) for e in doc["environments"] if isinstance(e, dict)]
    env = doc.get("environment")
    fingerprint = EnvFingerprint.model_validate(env) if isinstance(env, dict) else None
    layers = {str(k): LayerCounts.model_validate(v) for k, v in doc["layers"].items() if isinstance(v, dict)}
    return summarize_environments([(fingerprint, layers)]) if doc.get("processes", 1) == 1 else []


def merge_environments(docs: Iterable[dict[str, Any]]) -> list[EnvironmentSummary]:
    """Per (torch, triton) over many documents: processes and lookups add up."""
    acc: dict[tuple[str | None, str | None], EnvironmentSummary] = {}
    for doc in docs:
        for env in _environments_of(doc):
            key = (env.torch, env.triton)
            old = acc.get(key)
            if old is not None:
                n, h, m, e = old.processes + env.processes, old.hits + env.hits, old.misses + env.misses, old.errors + env.errors
                env = EnvironmentSummary(torch=env.torch, triton=env.triton, processes=n, hits=h, misses=m, errors=e, hit_rate=hit_rate(h, m, e))
            acc[key] = env
    return sorted(acc.values(), key=lambda s: (s.torch or "", s.triton or ""), reverse=True)


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


def _read_document(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == STATS_FORMAT else None


def write_stats(path: str | os.PathLike[str], doc: dict[str, Any]) -> Path:
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
            doc = merge_documents([existing, doc])
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return target


def load_stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The merged document of a stats file, or of every ``kcache-stats-*.json`` in a directory.

    Raises FileNotFoundError when there is nothing to read."""
    p = Path(path).expanduser()
    if p.is_dir():
        docs = [d for f in sorted(p.glob(f"{DIR_FILE_PREFIX}*.json")) if (d := _read_document(f)) is not None]
        if not docs:
            raise FileNotFoundError(f"no {DIR_FILE_PREFIX}*.json stats files in {p}")
        return merge_documents(docs)
    doc = _read_document(p)
    if doc is None:
        if not p.exists():
            raise FileNotFoundError(f"no stats file {p}")
        raise ValueError(f"{p} is not a kcache stats file")
    return merge_documents([doc])
