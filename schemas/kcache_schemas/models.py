"""Pydantic models of the wire contract (JSON bodies and the manifest inside a kernel pack)."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from kcache_schemas.keys import (
    normalize_entry_key,
    normalize_kernel_key,
    validate_layer,
    validate_namespace,
)

PACK_FORMAT: Final = "kcache-pack"
PACK_FORMAT_VERSION: Final = 1
GROUP_PREFIX = "__grp__"
REPLACE_SENTINEL = "[REPLACE]"

# A file name inside a kernel dir: no separators, no NUL, no leading dot (so no "." or ".."),
# and the only double-underscore name allowed is Triton's group file.
_FILENAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def validate_filename(name: str) -> str:
    if not _FILENAME_RE.match(name):
        raise ValueError(
            f"file name {name[:80]!r} is not allowed: use [A-Za-z0-9_.+-], no '/', no leading '.'"
        )
    if name.startswith("__") and not (name.startswith(GROUP_PREFIX) and name.endswith(".json")):
        raise ValueError(f"file name {name!r}: only Triton's __grp__<name>.json may start with '__'")
    return name


def _sha256_hex(value: str) -> str:
    if not _SHA256_RE.match(value):
        raise ValueError("sha256 must be 64 lowercase hex chars")
    return value


KernelKey = Annotated[str, AfterValidator(normalize_kernel_key)]
Namespace = Annotated[str, AfterValidator(validate_namespace)]
Layer = Annotated[str, AfterValidator(validate_layer)]
EntryKey = Annotated[str, AfterValidator(normalize_entry_key)]
FileName = Annotated[str, AfterValidator(validate_filename)]
Sha256 = Annotated[str, AfterValidator(_sha256_hex)]


class DeviceType(str, Enum):
    CUDA = "cuda"
    HIP = "hip"
    XPU = "xpu"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PackFile(_Model):
    name: FileName
    size: int = Field(ge=0)
    sha256: Sha256


class KernelTarget(_Model):
    """What hardware the kernel runs on, read from ``<name>.json``'s ``target``."""

    device_type: DeviceType
    arch: str = Field(min_length=1, max_length=32, description="e.g. '90' for sm_90, 'gfx942'")
    warp_size: int = Field(ge=1, le=1024)


class Producer(_Model):
    """Who made an entry. Versions only: nothing machine-local (no host, user or path)."""

    kcache_version: str | None = None
    torch_version: str | None = None
    triton_version: str | None = None
    # Seconds the producer spent compiling; a hit credits this as compile time saved.
    compile_time_s: float | None = Field(default=None, ge=0)


class KernelManifest(_Model):
    """The manifest inside a kernel pack: one Triton kernel dir, ``.json`` files path-free."""

    format: Literal["kcache-pack"] = PACK_FORMAT
    version: Literal[1] = PACK_FORMAT_VERSION
    key: KernelKey
    kernel_name: FileName
    target: KernelTarget
    triton_version: str = Field(min_length=1, max_length=64)
    files: list[PackFile] = Field(min_length=2, max_length=64)
    producer: Producer = Producer()

    @model_validator(mode="after")
    def _files_form_a_kernel_dir(self) -> KernelManifest:
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate file names in manifest: {dupes}")
        for required in (f"{self.kernel_name}.json", self.group_file):
            if required not in names:
                raise ValueError(f"manifest lacks {required!r}, which every Triton kernel dir has")
        return self

    @property
    def group_file(self) -> str:
        return f"{GROUP_PREFIX}{self.kernel_name}.json"

    @property
    def metadata_file(self) -> str:
        return f"{self.kernel_name}.json"

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def content_digest(self) -> str:
        """Identity of the kernel dir's contents, independent of how the pack was compressed.

        Two uploads for one key are "identical" (write-once allows the second) when this matches.
        """
        h = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.name):
            h.update(f"{f.name}\0{f.size}\0{f.sha256}\n".encode())
        return h.hexdigest()


class KernelEntry(_Model):
    """A stored kernel as the API describes it."""

    namespace: Namespace
    key: KernelKey
    kernel_name: FileName
    target: KernelTarget
    triton_version: str
    files: list[PackFile]
    total_size: int = Field(ge=0, description="bytes of the unpacked kernel dir")
    pack_size: int = Field(ge=0, description="bytes of the compressed pack")
    content_digest: Sha256
    created_at: datetime
    producer: Producer = Producer()


class KernelList(_Model):
    items: list[KernelEntry]
    next_cursor: str | None = None


class MissingRequest(_Model):
    keys: list[str] = Field(max_length=10_000)


class MissingResponse(_Model):
    missing: list[str]
    invalid: list[str] = Field(default_factory=list)


class BatchGetRequest(_Model):
    keys: list[str] = Field(min_length=1, max_length=5_000)


class EntryInfo(_Model):
    """An opaque Inductor remote-cache entry (FX graph, autotune, ...). Never unpickled."""

    namespace: Namespace
    layer: Layer
    key: EntryKey
    size: int = Field(ge=0)
    sha256: Sha256
    created_at: datetime
    producer: Producer = Producer()


class ErrorDetail(_Model):
    code: str
    message: str
    detail: Any = None


class ErrorBody(_Model):
    error: ErrorDetail


class EnvFingerprint(_Model):
    """What must match for compiled artifacts to be reusable (see kcache.fingerprint)."""

    torch: str | None = None
    triton: str | None = None
    cuda: str | None = None
    hip: str | None = None
    gpu_arch: str | None = None

    @property
    def id(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.model_dump().items() if v) or "unknown environment"

    def diff(self, other: EnvFingerprint) -> str:
        mine, theirs = self.model_dump(), other.model_dump()
        return ", ".join(f"{k} {theirs[k]} -> {mine[k]}" for k in mine if mine[k] != theirs[k])


class EntryRef(_Model):
    layer: Layer
    key: EntryKey


class WorkloadManifest(_Model):
    """Every kernel and cache entry one job used; published at exit, prefetched by the next job."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    fingerprint: EnvFingerprint
    kernels: list[KernelKey] = Field(default_factory=list, max_length=200_000)
    entries: list[EntryRef] = Field(default_factory=list, max_length=200_000)


class WorkloadView(_Model):
    """The merged manifest of every published run of a workload in one environment."""

    name: str
    fingerprint: EnvFingerprint
    kernels: list[str]
    entries: list[EntryRef]
    runs: int
    other_fingerprints: list[EnvFingerprint] = Field(default_factory=list)


class WorkloadSummary(_Model):
    name: str
    runs: int
    fingerprints: list[EnvFingerprint]


# ---- run statistics (cache-hit metrics per CI job / training run) ----------------------------

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,127}$")
_STAT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_./-]{0,63}$")


def validate_run_id(raw: str) -> str:
    """A run id (e.g. a CI job id): 1-128 chars of [A-Za-z0-9_.:+-], no path separator."""
    if not _RUN_ID_RE.match(raw):
        from kcache_schemas.keys import InvalidKeyError

        raise InvalidKeyError(f"run id {raw[:80]!r} must be 1-128 chars of [A-Za-z0-9_.:+-]")
    return raw


def _stat_names(value: dict[str, Any]) -> dict[str, Any]:
    for name in value:
        if not _STAT_NAME_RE.match(name):
            raise ValueError(f"stat name {name[:80]!r} must be 1-64 chars of [a-z0-9_./-]")
    return value


def _reason_names(value: dict[str, int]) -> dict[str, int]:
    for name in value:
        if not 1 <= len(name) <= 128:
            raise ValueError("reason names must be 1-128 chars")
    return value


Reasons = Annotated[dict[str, Annotated[int, Field(ge=0)]], Field(max_length=64), AfterValidator(_reason_names)]


class _Lenient(BaseModel):
    """Stats bodies ignore unknown fields: a newer client's extra counter must not cost a run its stats."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class LayerCounts(_Lenient):
    """One cache layer's counters (``kernel``, ``fx-graph``, ``autotune``, ...), as kcache.stats counts them.

    Errors (service down, bad answer, refused pack) are never misses: hit rate is
    hits / (hits + misses + errors)."""

    hits: int = Field(default=0, ge=0)
    misses: int = Field(default=0, ge=0)
    errors: int = Field(default=0, ge=0)
    puts: int = Field(default=0, ge=0)
    put_errors: int = Field(default=0, ge=0)
    skipped: int = Field(default=0, ge=0)
    bytes_down: int = Field(default=0, ge=0)
    bytes_up: int = Field(default=0, ge=0)
    seconds: float = Field(default=0.0, ge=0)
    saved_s: float = Field(default=0.0, ge=0)
    miss_reasons: Reasons = Field(default_factory=dict)
    error_kinds: Reasons = Field(default_factory=dict)


Layers = Annotated[dict[str, LayerCounts], Field(max_length=64), AfterValidator(_stat_names)]


def hit_rate(hits: int, misses: int, errors: int) -> float | None:
    """Percent of lookups that hit; errors count against it. None when there were no lookups.
    The one definition, for client stats files, reports and the service's run aggregates."""
    lookups = hits + misses + errors
    return 100.0 * hits / lookups if lookups else None


class EnvironmentSummary(_Model):
    """One environment's share of a run (a fleet mid-upgrade runs several torch/triton pairs):
    processes that reported from it and their lookups."""

    torch: str | None = None
    triton: str | None = None
    processes: int = 0
    hits: int = 0
    misses: int = 0
    errors: int = 0
    hit_rate: float | None = None

    @property
    def label(self) -> str:
        return f"torch {self.torch or '?'}, triton {self.triton or '?'}"


def summarize_environments(reports: list[tuple[EnvFingerprint | None, dict[str, LayerCounts]]]) -> list[EnvironmentSummary]:
    """Per (torch, triton): processes and lookups of ``(environment, layers)`` reports, newest torch first."""
    acc: dict[tuple[str | None, str | None], list[int]] = {}
    for env, layers in reports:
        key = (env.torch, env.triton) if env is not None else (None, None)
        counts = acc.setdefault(key, [0, 0, 0, 0])
        counts[0] += 1
        for c in layers.values():
            counts[1] += c.hits
            counts[2] += c.misses
            counts[3] += c.errors
    out = [
        EnvironmentSummary(torch=t, triton=tr, processes=n, hits=h, misses=m, errors=e, hit_rate=hit_rate(h, m, e))
        for (t, tr), (n, h, m, e) in acc.items()
    ]
    return sorted(out, key=lambda s: (s.torch or "", s.triton or ""), reverse=True)


class RunStatsReport(_Lenient):
    """What one process sends at exit to ``POST /v1/{namespace}/runs/{run_id}/stats``.

    ``report_id`` is chosen by the client, so a retried POST stores one contribution, not two."""

    report_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{8,64}$")
    host: str = Field(default="", max_length=255)
    pid: int = Field(default=0, ge=0)
    workload: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    kcache_version: str | None = Field(default=None, max_length=64)
    started_at: float = Field(default=0.0, ge=0)
    ended_at: float = Field(default=0.0, ge=0)
    environment: EnvFingerprint | None = Field(default=None, description="torch, triton, CUDA/HIP and GPU arch of the process")
    layers: Layers = Field(default_factory=dict)


class RunSummary(_Model):
    """One run (e.g. a CI job), summed over every process that reported into it."""

    run_id: str
    namespace: str
    workload: str | None = None
    workloads: list[str] = Field(default_factory=list)
    processes: int
    started_at: float
    ended_at: float
    hits: int
    misses: int
    errors: int
    puts: int
    bytes_down: int
    bytes_up: int
    seconds: float
    saved_s: float
    hit_rate: float | None = Field(description="hits / (hits + misses + errors) in percent; null with no lookups")
    environments: list[EnvironmentSummary] = Field(default_factory=list, description="the run per torch/triton pair")


class RunAggregate(RunSummary):
    layers: dict[str, LayerCounts]


class RunList(_Model):
    items: list[RunSummary]


def sum_layer_counts(many: list[dict[str, LayerCounts]]) -> dict[str, LayerCounts]:
    """Add up per-layer counters of many processes (client stats files and service runs alike)."""
    totals: dict[str, dict[str, Any]] = {}
    for layers in many:
        for name, counts in layers.items():
            acc = totals.setdefault(name, {"miss_reasons": {}, "error_kinds": {}})
            for field_name, value in counts:
                if isinstance(value, dict):
                    bucket = acc[field_name]
                    for reason, n in value.items():
                        bucket[reason] = bucket.get(reason, 0) + n
                else:
                    acc[field_name] = acc.get(field_name, 0) + value
    for acc in totals.values():
        for field_name in ("miss_reasons", "error_kinds"):
            acc[field_name] = _cap_reasons(acc[field_name])
    return {name: LayerCounts.model_validate(acc) for name, acc in sorted(totals.items())}


def _cap_reasons(reasons: dict[str, int], limit: int = 64) -> dict[str, int]:
    """Keep the most frequent reasons within the model's bound; lump the rest into "other"."""
    if len(reasons) <= limit:
        return reasons
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[: limit - 1])
    kept["other"] = kept.get("other", 0) + sum(n for _k, n in ranked[limit - 1 :])
    return kept
