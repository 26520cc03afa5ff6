"""``kcache explain``: for each miss, the nearest stored key of the same layer and what differs.

Candidates are the keys the job's workload stored in its environment (the workload's view); a
workload recorded only under other environments is explained by the fingerprint fields that
differ (torch, triton, CUDA, GPU arch). Key parts come from the ``key-components`` layer (see
:mod:`kcache.key_components`). Used by the CLI and by the must-hit guard; diagnostic only: a
hostile service can make an explanation wrong, never a compile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kcache_schemas import signature as envelope
from kcache_schemas import wire
from kcache_schemas.explain import (
    WORKLOAD_MISS,
    Change,
    KeyComponents,
    MissRecord,
    components_key,
    graph_key,
    nearest,
    nearest_fingerprint,
)
from kcache_schemas.models import EnvFingerprint, WorkloadView

from kcache.errors import KcacheError, NotFound
from kcache.http import KcacheClient
from kcache.workload import fetch_view

COMPONENTS_LAYER = wire.CacheLayer.KEY_COMPONENTS.value
KERNEL_LAYER = wire.CacheLayer.KERNEL.value

MAX_CANDIDATES = 64  # the workload's last keys of the layer fetched per explanation (small JSON entries)


@dataclass
class Explanation:
    layer: str
    key: str
    nearest: str | None = None  # the stored key (or environment) compared against
    changes: list[Change] = field(default_factory=list)
    note: str = ""

    def headline(self) -> str:
        """One line: what differs, or why nothing can be said."""
        if self.changes:
            shown = "; ".join(f"{c.name}: {c.stored} -> {c.wanted}" for c in self.changes[:4])
            more = f" (+{len(self.changes) - 4} more)" if len(self.changes) > 4 else ""
            return f"differs from {self.nearest} in {shown}{more}"
        return self.note or "no explanation found"

    def render(self) -> str:
        lines = [f"{self.layer} {graph_key(self.key)}"]
        if self.nearest is not None and self.changes:
            lines.append(f"  nearest stored: {self.nearest}  ({len(self.changes)} part(s) differ)")
            lines += [f"    {c.name}: {_value(c.stored)} -> {_value(c.wanted)}" for c in self.changes]
        else:
            lines.append(f"  {self.note or 'no explanation found'}")
        return "\n".join(lines)


def _value(v: str | None) -> str:
    return "(absent)" if v is None else v


def fetch_components(client: KcacheClient, layer: str, key: str) -> KeyComponents | None:
    """The recorded parts of a key, or None if no process recorded them."""
    try:
        stored, _compile_time = client.get_entry(COMPONENTS_LAYER, components_key(layer, key))
    except NotFound:
        return None
    payload = envelope.parse(stored).payload() if envelope.is_signed(stored) else stored
    return KeyComponents.model_validate_json(payload)


def _workload_view(client: KcacheClient, workload: str | None, environment: EnvFingerprint | None) -> WorkloadView | None:
    if not workload:
        return None
    if environment is None:
        return fetch_view(client, workload)
    try:
        body = client.get_json(wire.path(wire.WORKLOAD, namespace=client.config.namespace, name=workload), fingerprint=environment.id)
    except NotFound:
        return None
    return WorkloadView.model_validate(body)


def explain_workload(client: KcacheClient, workload: str, environment: EnvFingerprint) -> Explanation:
    """Why a workload's manifest was not found for this environment: the nearest environment it
    was recorded for, and the fields that differ."""
    out = Explanation(WORKLOAD_MISS, workload)
    view = _workload_view(client, workload, environment)
    if view is None:
        out.note = f"no workload {workload!r} was published in this namespace"
        return out
    found = nearest_fingerprint(environment, view.other_fingerprints)
    if found is None:
        out.note = f"workload {workload!r} is recorded only for this environment ({environment.describe()})"
        return out
    fp, out.changes = found
    since = f"; {view.runs} run(s) here since" if view.runs else ""
    out.nearest = f"workload {workload!r} as recorded for {fp.describe()}{since}"
    return out


def explain_key(
    client: KcacheClient, layer: str, key: str, *, workload: str | None = None,
    environment: EnvFingerprint | None = None, wanted: KeyComponents | None = None,
) -> Explanation:
    """The nearest stored key of ``layer`` in the workload's view, and the parts that differ."""
    out = Explanation(layer, key)
    wanted = wanted or fetch_components(client, layer, key)
    if wanted is None:
        out.note = "no process recorded this key's parts (kcache records them where a key misses)"
        return out
    view = _workload_view(client, workload, environment)
    if view is None or not view.runs:
        if workload and environment is not None and view is not None and view.other_fingerprints:
            return explain_workload(client, workload, environment)
        out.note = ("no stored key to compare with: " +
                    (f"workload {workload!r} has no run here" if workload else "the job ran without KCACHE_WORKLOAD"))
        return out
    candidates: list[KeyComponents] = []
    stored_keys = view.kernels if layer == KERNEL_LAYER else [e.key for e in view.entries if e.layer == layer]
    for stored_key in stored_keys[-MAX_CANDIDATES:]:
        if graph_key(stored_key) == graph_key(key):
            continue
        try:
            found = fetch_components(client, layer, stored_key)
        except (KcacheError, ValueError):
            continue
        if found is not None:
            candidates.append(found)
    best = nearest(wanted, candidates)
    if best is None:
        out.note = f"workload {workload!r} stored no other {layer} key with recorded parts"
        return out
    stored, out.changes = best
    out.nearest = graph_key(stored.key)
    if not out.changes:
        out.note = "the nearest stored key has the same parts (it was stored under another key format)"
    return out


def explain_misses(
    client: KcacheClient, missed: list[MissRecord], *, workload: str | None, environment: EnvFingerprint | None,
) -> list[Explanation]:
    out = []
    for record in missed:
        if record.layer == WORKLOAD_MISS:
            out.append(explain_workload(client, record.key, environment or EnvFingerprint()))
        else:
            out.append(explain_key(client, record.layer, record.key, workload=workload, environment=environment))
    return out
