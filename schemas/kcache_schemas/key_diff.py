"""Why did it miss? The parts of a cache key, and what differs between a missed key and the
nearest one stored.

Inductor computes its FX-graph key from named parts (``FxGraphHashDetails``: every Inductor config
setting, the torch version, the inputs, system info, user-defined Triton kernel sources, ...) and
prints them as ``[<hash>] <name>: <value>`` lines; Triton builds a kernel's key from its version,
the kernel source, the backend (ptxas version, GPU arch), every compile option and the
cache-invalidating environment variables. The client keeps those parts, bounded, beside
each key it compiled (an entry of the ``key-components`` layer); ``kcache explain`` diffs a missed
key's parts against the stored keys of the same workload and names the parts that differ. A
workload found under another environment is explained by its fingerprint's fields.

Values are what torch already prints in its debug lines, or what Triton hashes into its key
(truncated here); kcache never adds an environment variable's value that they do not hash in.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from kcache_schemas.models import EnvFingerprint

MAX_COMPONENTS: Final = 2048  # Inductor's config alone has ~400 settings
MAX_VALUE_CHARS: Final = 400
# MissRecord.layer of a workload whose manifest exists only for other environments.
WORKLOAD_MISS: Final = "workload"
MAX_MISS_RECORDS: Final = 64  # per stats document: enough to explain, bounded for every merge
_DEBUG_LINE = re.compile(r"^\[(?P<hash>[^\]]{1,128})\]\s(?P<name>[^:]{1,256}):\s?(?P<value>.*)$", re.DOTALL)
# Inductor's remote caches format keys as ``pt2:<cache id>::<key>:c<version>``.
_REMOTE_KEY = re.compile(r"^pt2:[^:]+::(?P<key>[^:]+):c\d+$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Component(_Model):
    """One named part of a key: its hash (what the key is made of) and its value as torch prints it."""

    hash: str = Field(max_length=128)
    value: str = Field(default="", max_length=MAX_VALUE_CHARS + 3)


class KeyComponents(_Model):
    """The parts of one key of a layer, as the process that computed the key saw them.

    ``context``: what that compile depended on beyond its key (Inductor settings torch leaves
    out of its key, backend switches, the rank, hashes of ``TORCHINDUCTOR_*``/``TRITON_*``
    variables; :mod:`kcache.layers.key_context`), ``environment`` and ``run_id``: where it ran. None of
    them is part of the key: they name the suspects when two compiles of one key disagree
    (:mod:`kcache_schemas.unsound_reports`) and let ``kcache purge`` select by environment or run."""

    layer: str = Field(max_length=64)
    key: str = Field(max_length=512)
    components: dict[str, Component] = Field(default_factory=dict, max_length=MAX_COMPONENTS)
    context: dict[str, Component] = Field(default_factory=dict, max_length=MAX_COMPONENTS)
    environment: EnvFingerprint | None = None
    run_id: str | None = Field(default=None, max_length=128)


class Change(_Model):
    """A part that differs: ``stored`` is the nearest stored key's value, ``wanted`` the missed
    key's (None where the part is absent on that side)."""

    name: str
    stored: str | None
    wanted: str | None


class MissRecord(_Model):
    """A lookup that missed (local and remote): what ``kcache explain --file/--run`` explains."""

    layer: str = Field(max_length=64)
    key: str = Field(max_length=512)
    reason: str = Field(default="not_found", max_length=128)


def _short(value: str) -> str:
    return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "..."


def parse_debug_lines(lines: Iterable[str]) -> dict[str, Component]:
    """Inductor's ``[hash] name: value`` lines as named components (bounded; others skipped)."""
    out: dict[str, Component] = {}
    for line in lines:
        match = _DEBUG_LINE.match(line)
        if match is None:
            continue
        out[match["name"].strip()] = Component(hash=match["hash"], value=_short(match["value"].strip()))
        if len(out) >= MAX_COMPONENTS:
            break
    return out


def from_parts(layer: str, key: str, parts: Mapping[str, tuple[str, str]]) -> KeyComponents:
    """A key's parts given as ``name -> (hash, value)`` (values bounded like Inductor's lines)."""
    named = {name: Component(hash=digest[:128], value=_short(value)) for name, (digest, value) in list(parts.items())[:MAX_COMPONENTS]}
    return KeyComponents(layer=layer, key=key[:512], components=named)


def graph_key(key: str) -> str:
    """Inductor's own key from a remote-cache key (``pt2:fx-graph-v1::<key>:c1`` -> ``<key>``)."""
    match = _REMOTE_KEY.match(key)
    return match["key"] if match else key


def components_key(layer: str, key: str) -> str:
    """Where a key's components are stored (an entry key of the ``key-components`` layer): the
    same for Inductor's key and its remote-cache form, within the entry-key rules."""
    raw = f"{layer}.{graph_key(key)}"
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.=+-]{0,255}", raw):
        return raw
    return f"{layer}.h-{hashlib.sha256(graph_key(key).encode()).hexdigest()}"


# The parts of a key that name the computation (the graph and its inputs; a kernel's function and
# signature) rather than the settings it was compiled with: two keys that share them are the same
# computation compiled differently, whatever the job or workload (``kcache explain`` without a
# workload looks for stored keys by them).
IDENTITY_PARTS: Final[dict[str, tuple[str, ...]]] = {
    "fx-graph": ("gm", "example_inputs", "inputs_to_check", "user_defined_triton_source"),
    "kernel": ("source[function]", "source[signature]"),
}
IDENTITY_MARK: Final = ".i."  # key-components entry key: <layer>.i.<identity>.<key or its hash>


def identity(parts: KeyComponents) -> str | None:
    """A hash of the key's identity parts (their hashes, by name); None where the layer has none
    or the key recorded none of them."""
    names = IDENTITY_PARTS.get(parts.layer, ())
    found = sorted((n, parts.components[n].hash) for n in names if n in parts.components)
    if not found:
        return None
    return hashlib.sha256(repr(found).encode()).hexdigest()[:32]


def identity_prefix(layer: str, ident: str) -> str:
    """The key prefix of the identity markers of ``layer`` with this identity."""
    return f"{layer}{IDENTITY_MARK}{ident}."


def identity_marker(layer: str, ident: str, key: str) -> str:
    """The key-components entry that files ``key`` under its identity: listing the identity's
    prefix finds every recorded key of the computation (one small entry each, its name is the
    index)."""
    return identity_prefix(layer, ident) + components_key(layer, key)[len(layer) + 1 :]


def components_key_of_marker(layer: str, ident: str, marker: str) -> str | None:
    """The components entry an identity marker points at; None for another key."""
    prefix = identity_prefix(layer, ident)
    return f"{layer}.{marker[len(prefix):]}" if marker.startswith(prefix) and len(marker) > len(prefix) else None


def diff(stored: Mapping[str, Component], wanted: Mapping[str, Component]) -> list[Change]:
    """The parts whose hashes differ, in the order Inductor lists them (then stored-only ones)."""
    changes = [
        Change(name=name, stored=stored[name].value if name in stored else None, wanted=part.value)
        for name, part in wanted.items()
        if name not in stored or stored[name].hash != part.hash
    ]
    changes += [Change(name=name, stored=part.value, wanted=None) for name, part in stored.items() if name not in wanted]
    return changes


def nearest(wanted: KeyComponents, candidates: Sequence[KeyComponents]) -> tuple[KeyComponents, list[Change]] | None:
    """The stored key of the same layer whose parts differ least from ``wanted``'s (ties: the
    first given), with the differences; None without candidates."""
    best: tuple[KeyComponents, list[Change]] | None = None
    for candidate in candidates:
        if candidate.layer != wanted.layer or candidate.key == wanted.key:
            continue
        changes = diff(candidate.components, wanted.components)
        if best is None or len(changes) < len(best[1]):
            best = (candidate, changes)
    return best


def fingerprint_changes(stored: EnvFingerprint, wanted: EnvFingerprint) -> list[Change]:
    """The environment fields that differ (torch, triton, cuda, hip, gpu_arch)."""
    mine, theirs = wanted.model_dump(), stored.model_dump()
    return [Change(name=k, stored=theirs[k], wanted=mine[k]) for k in mine if mine[k] != theirs[k]]


def nearest_fingerprint(wanted: EnvFingerprint, stored: Sequence[EnvFingerprint]) -> tuple[EnvFingerprint, list[Change]] | None:
    found = [(fp, fingerprint_changes(fp, wanted)) for fp in stored]
    return min(found, key=lambda pair: len(pair[1])) if found else None


def merge_misses(groups: Iterable[Iterable[MissRecord]]) -> list[MissRecord]:
    """Miss records of many documents: each (layer, key) once, at most ``MAX_MISS_RECORDS``."""
    seen: dict[tuple[str, str], MissRecord] = {}
    for group in groups:
        for record in group:
            if len(seen) >= MAX_MISS_RECORDS:
                return list(seen.values())
            seen.setdefault((record.layer, record.key), record)
    return list(seen.values())
