"""``kcache explain``: for each miss, the nearest stored key of the same layer and what differs.

Candidates are the keys the job's workload stored in its environment (the workload's view); a
workload recorded only under other environments is explained by the fingerprint fields that
differ (torch, triton, CUDA, GPU arch). A job without a workload (only ``KCACHE_URL`` set), or
one whose workload stored nothing comparable, is compared namespace-wide with the recorded keys
of the same computation: the keys whose identity parts (the graph and its inputs; a kernel's
function and signature, :data:`kcache_schemas.key_diff.IDENTITY_PARTS`) are the same, found by
one listing of their identity markers, at most ``MAX_IDENTITY_CANDIDATES`` of them read. Key
parts come from the ``key-components`` layer (see :mod:`kcache.layers.inductor.key_components`). A key a
canary found unsound (:mod:`kcache.layers.key_canary`) is explained by its report: what differed in the
output and which recorded inputs differ between the two compiles. Used by the CLI and by the
must-hit guard; diagnostic only: a hostile service can make an explanation wrong, never a compile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

from kcache_schemas import signed_envelope as envelope
from kcache_schemas import wire
from kcache_schemas.key_diff import (
    WORKLOAD_MISS,
    Change,
    KeyComponents,
    MissRecord,
    components_key,
    components_key_of_marker,
    graph_key,
    identity,
    identity_prefix,
    nearest,
    nearest_fingerprint,
)
from kcache_schemas.models import EnvFingerprint, WorkloadView
from kcache_schemas.unsound_reports import UnsoundReport

from kcache.exceptions import KcacheError, NotFound
from kcache.transport.http import KcacheClient
from kcache.transport.workload import fetch_view

COMPONENTS_LAYER = wire.CacheLayer.KEY_COMPONENTS.value
KERNEL_LAYER = wire.CacheLayer.KERNEL.value

MAX_CANDIDATES = 64  # the workload's last keys of the layer fetched per explanation (small JSON entries)
MAX_IDENTITY_CANDIDATES = 16  # recorded keys of the same computation read per explanation, namespace-wide
FX_REMOTE_FORM = "pt2:fx-graph-v1::{key}:c1"  # how Inductor's remote FX-graph cache names a key


@dataclass
class Explanation:
    layer: str
    key: str
    nearest: str | None = None  # the stored key (or environment) compared against
    changes: list[Change] = field(default_factory=list)
    note: str = ""
    unsound: UnsoundReport | None = None  # a canary found this key unsound

    def headline(self) -> str:
        """One line: what differs, or why nothing can be said."""
        if self.unsound is not None:
            named = "; ".join(f"{c.name}: {c.stored} -> {c.wanted}" for c in self.unsound.suspects[:4])
            return "the key is unsound (a canary's compile differed from the entry; quarantined)" + (f", suspects: {named}" if named else "")
        if self.changes:
            shown = "; ".join(f"{c.name}: {c.stored} -> {c.wanted}" for c in self.changes[:4])
            more = f" (+{len(self.changes) - 4} more)" if len(self.changes) > 4 else ""
            return f"differs from {self.nearest} in {shown}{more}"
        return self.note or "no explanation found"

    def render(self) -> str:
        lines = [f"{self.layer} {graph_key(self.key)}"]
        if self.unsound is not None:
            return "\n".join(lines + render_unsound(self.unsound))
        if self.nearest is not None and self.changes:
            lines.append(f"  nearest stored: {self.nearest}  ({len(self.changes)} part(s) differ)")
            lines += [f"    {c.name}: {_value(c.stored)} -> {_value(c.wanted)}" for c in self.changes]
        else:
            lines.append(f"  {self.note or 'no explanation found'}")
        return "\n".join(lines)


def _value(v: str | None) -> str:
    return "(absent)" if v is None else v


def _origin(parts: KeyComponents | None) -> str:
    if parts is None:
        return "recorded nothing (a client older than key parts, or its record was evicted)"
    env = parts.environment.describe() if parts.environment is not None else "environment not recorded"
    return f"{env}; run {parts.run_id or '-'}"


def render_unsound(report: UnsoundReport) -> list[str]:
    """An unsound key's report, for people: what differed in the output, and the suspects."""
    when = f" on {report.reported_at:%Y-%m-%d %H:%M} UTC" if report.reported_at else ""
    lines = [f"  UNSOUND KEY: a node's canary compiled it{when} and got other output than the stored entry,",
             "  which is quarantined for every node (each node compiles the key itself)",
             f"  compared       {report.compared}",
             f"  output         served {report.served_digest[:16]}, own {report.own_digest[:16]}"]
    if report.output_diff:
        lines.append("  what differed")
        lines += [f"    {line}" for line in report.output_diff]
    if report.suspects:
        lines.append(f"  suspects: recorded inputs that differ between the producer and the auditing node ({len(report.suspects)})")
        lines += [f"    {c.name}: {_value(c.stored)} -> {_value(c.wanted)}" for c in report.suspects]
    elif report.producer is None:
        lines.append("  suspects: unknown (the producer recorded no key parts to compare with)")
    else:
        lines.append("  suspects: none recorded: the missing factor is outside what kcache records (see the README)")
    lines.append(f"  producer       {_origin(report.producer)}")
    lines.append(f"  auditing node  {_origin(report.consumer)}; {report.reporter or 'kcache'}")
    return lines


def _components_entry(client: KcacheClient, entry_key: str) -> KeyComponents | None:
    try:
        stored, _compile_time = client.get_entry(COMPONENTS_LAYER, entry_key)
    except NotFound:
        return None
    payload = envelope.parse(stored).payload() if envelope.is_signed(stored) else stored
    return KeyComponents.model_validate_json(payload)


def fetch_components(client: KcacheClient, layer: str, key: str) -> KeyComponents | None:
    """The recorded parts of a key, or None if no process recorded them."""
    return _components_entry(client, components_key(layer, key))


def fetch_unsound(client: KcacheClient, layer: str, key: str) -> UnsoundReport | None:
    """A canary's report on the key (Inductor's key or its stored form), or None."""
    forms = [key]
    if layer == wire.CacheLayer.FX_GRAPH.value and graph_key(key) == key:
        forms.append(FX_REMOTE_FORM.format(key=key))
    for form in forms:
        try:
            return client.unsound_report(layer, form)
        except NotFound:  # no report (or a service older than the route)
            continue
    return None


def same_computation(client: KcacheClient, wanted: KeyComponents) -> list[KeyComponents]:
    """Recorded keys of the same computation as ``wanted`` (its identity parts), namespace-wide:
    one listing of the identity's markers, then at most ``MAX_IDENTITY_CANDIDATES`` small reads."""
    ident = identity(wanted)
    if ident is None:
        return []
    own = components_key(wanted.layer, wanted.key)
    found: list[KeyComponents] = []
    for marker in islice(client.list_entries(COMPONENTS_LAYER, prefix=identity_prefix(wanted.layer, ident),
                                             page_size=MAX_IDENTITY_CANDIDATES + 1), MAX_IDENTITY_CANDIDATES + 1):
        entry_key = components_key_of_marker(wanted.layer, ident, marker.key)
        if entry_key is None or entry_key == own:
            continue
        try:
            parts = _components_entry(client, entry_key)
        except (KcacheError, ValueError):
            continue
        if parts is not None:
            found.append(parts)
        if len(found) >= MAX_IDENTITY_CANDIDATES:
            break
    return found


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
    """The nearest stored key of ``layer`` in the workload's view (else namespace-wide among the
    recorded keys of the same computation), and the parts that differ; for a key a canary found
    unsound, its report."""
    out = Explanation(layer, key)
    out.unsound = fetch_unsound(client, layer, key)
    if out.unsound is not None:
        return out
    wanted = wanted or fetch_components(client, layer, key)
    if wanted is None:
        out.note = "no process recorded this key's parts (kcache records them where a key misses)"
        return out
    view = _workload_view(client, workload, environment)
    if workload and environment is not None and view is not None and not view.runs and view.other_fingerprints:
        return explain_workload(client, workload, environment)
    candidates: list[KeyComponents] = []
    stored_keys: list[str] = []
    if view is not None and view.runs:
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
    where = f"workload {workload!r}"
    if not candidates:  # workloads only narrow the search: the namespace has the rest
        candidates, where = same_computation(client, wanted), f"namespace {client.config.namespace!r}"
    best = nearest(wanted, candidates)
    if best is None:
        out.note = (f"no stored key of the same computation in {where}" + ("" if workload else " (the job ran without KCACHE_WORKLOAD)")
                    + ": nothing like it was compiled with kcache before, or its records were evicted")
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
