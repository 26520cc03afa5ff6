"""``kcache local``: the node's local tier as its owner sees it (huggingface_hub's scan-cache and
delete-cache): scan it per service, namespace and layer; plan what a selection deletes; delete.

The tier (:mod:`kcache.store.local_store`) names each service by a hash of its URL, so a scan marks the
one this machine's settings point at. Deleting is safe while jobs run: a reader that loses a file
sees a miss and asks the service.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from kcache.store.local_store import ENTRIES_DIR, service_id, tier_files


@dataclass
class TierFile:
    service: str
    namespace: str
    layer: str
    path: Path
    size: int
    last_used: float


@dataclass
class Group:
    """One service's namespace's layer in the tier."""

    service: str
    namespace: str
    layer: str
    files: int = 0
    size: int = 0
    last_used: float = 0.0


@dataclass
class Scan:
    root: Path
    files: list[TierFile] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def groups(self) -> list[Group]:
        out: dict[tuple[str, str, str], Group] = {}
        for f in self.files:
            g = out.setdefault((f.service, f.namespace, f.layer), Group(f.service, f.namespace, f.layer))
            g.files += 1
            g.size += f.size
            g.last_used = max(g.last_used, f.last_used)
        return sorted(out.values(), key=lambda g: (g.service, g.namespace, g.layer))


def scan(root: Path) -> Scan:
    """Every entry and pack file in the tier at ``root``, by service, namespace and layer."""
    found = Scan(root)
    entries = root / ENTRIES_DIR
    for mtime, size, path in tier_files(root):
        parts = path.relative_to(entries).parts  # <service>/<namespace>/<layer>/<xx>/<digest>
        if len(parts) != 5:
            continue  # not an entry (the eviction lock, a stray file)
        found.files.append(TierFile(parts[0], parts[1], parts[2], path, size, mtime))
    return found


def select(found: Scan, *, url: str | None = None, namespace: str | None = None, layer: str | None = None,
           unused_for_s: float | None = None, now: float | None = None) -> list[TierFile]:
    """The files a ``kcache local rm`` selection names (no selector: all)."""
    service = service_id(url) if url else None
    cutoff = (now if now is not None else time.time()) - unused_for_s if unused_for_s is not None else None
    return [
        f for f in found.files
        if (service is None or f.service == service) and (namespace is None or f.namespace == namespace)
        and (layer is None or f.layer == layer) and (cutoff is None or f.last_used < cutoff)
    ]


def delete(files: list[TierFile]) -> tuple[int, int]:
    """Delete the files; ``(files, bytes)`` deleted (one gone meanwhile is not counted)."""
    count = nbytes = 0
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            f.path.unlink()
            count += 1
            nbytes += f.size
    return count, nbytes
