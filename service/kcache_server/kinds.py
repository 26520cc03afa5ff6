"""The kinds of index record, spelled once: what the store's concerns (:mod:`kcache_server.store`)
and the metrics agree on. A record's kind is ``kernel``, ``entry/<layer>``, ``workload/<name>`` (one record per
published run), ``run/<run id>`` (one per process report), ``run`` (one marker per run), ``pin``
(one per pinned workload), ``gc`` (the namespace's last GC report) or ``quarantine/<layer>``
(one per entry reported unloadable: no blob, never evicted, outlives the entry it names).

Kernels and entries are the *cache*: they hold blobs, count against a namespace's storage
budget and are what the GC evicts."""

from __future__ import annotations

from kcache_schemas import wire

from kcache_server.storage.base import KindUsage

KERNEL = wire.CacheLayer.KERNEL.value
RUN = "run"
WORKLOAD = "workload"
PIN = "pin"
GC = "gc"
ENTRY_PREFIX = "entry/"
QUARANTINE_PREFIX = "quarantine/"


def entry_kind(layer: str) -> str:
    return f"{ENTRY_PREFIX}{layer}"


def quarantine_kind(layer: str) -> str:
    return f"{QUARANTINE_PREFIX}{layer}"


def is_cache_kind(kind: str) -> bool:
    """Kernels and entries: what budgets count and the GC evicts."""
    return kind == KERNEL or kind.startswith(ENTRY_PREFIX)


def workload_name(kind: str) -> str | None:
    """The workload a ``workload/<name>`` kind belongs to, else None."""
    head, _, name = kind.partition("/")
    return name if head == WORKLOAD and name else None


def run_kind(run_id: str) -> str:
    return f"{RUN}/{run_id}"


def workload_kind(name: str) -> str:
    return f"{WORKLOAD}/{name}"


def family(kind: str) -> str:
    """``entry/fx-graph`` and ``quarantine/dynamo`` stay (layers are a fixed set); ``run/<id>``
    and ``workload/<name>`` collapse into their family (bounded label sets for metrics, one line
    per family in usage)."""
    head = kind.split("/", 1)[0] + "/"
    return kind if head in (ENTRY_PREFIX, QUARANTINE_PREFIX) else head[:-1]


def collapse_usage(usage: dict[str, KindUsage]) -> dict[str, KindUsage]:
    out: dict[str, KindUsage] = {}
    for kind, u in usage.items():
        label = family(kind)
        prev = out.get(label, KindUsage(0, 0))
        out[label] = KindUsage(prev.entries + u.entries, prev.bytes + u.bytes)
    return dict(sorted(out.items()))
