"""Cache statistics, one model and one arithmetic for every side: the client's per-process counts
and stats files, the reports (``kcache stats``, the exit summary), and the service's runs.

* :class:`LayerCounts`: one cache layer's counters (``kernel``, ``fx-graph``, ...), with
  ``lookups`` and ``hit_rate``. Errors (service down, bad answer, refused pack) are never misses:
  hit rate is ``hits / (hits + misses + errors)``, so a degraded cache cannot pose as a cold one
  (bazel-remote #649, sccache #2820).
* :class:`StatsDocument`: the counts of one process or of many merged (a stats file, a run).
  Documents merge by adding up, so ranks can share one file and a run sums its reports.
* :class:`RunStatsReport`: what one process sends to its run; :class:`RunAggregate` what the
  service answers for the run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from kcache_schemas.key_diff import MAX_MISS_RECORDS, MissRecord, merge_misses
from kcache_schemas.models import EnvFingerprint, RunId, WorkloadName

STATS_FORMAT: Final = "kcache-stats"
STATS_VERSION: Final = 1
_STAT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_./-]{0,63}$")
_MAX_REASONS = 64


def _stat_names(value: dict[str, Any]) -> dict[str, Any]:
    for name in value:
        if not _STAT_NAME_RE.fullmatch(name):
            raise ValueError(f"stat name {name[:80]!r} must be 1-64 chars of [a-z0-9_./-]")
    return value


def _reason_names(value: dict[str, int]) -> dict[str, int]:
    for name in value:
        if not 1 <= len(name) <= 128:
            raise ValueError("reason names must be 1-128 chars")
    return value


# The names' rules for documents (validation stays the functions above, with their messages).
# The pattern sits under allOf: a key pattern at the top would turn into patternProperties, which
# leave keys that do not match it unconstrained instead of refused.
_StatName = Annotated[str, WithJsonSchema({"type": "string", "allOf": [{"pattern": _STAT_NAME_RE.pattern}]})]
_ReasonName = Annotated[str, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 128})]
Reasons = Annotated[dict[_ReasonName, Annotated[int, Field(ge=0)]], Field(max_length=_MAX_REASONS), AfterValidator(_reason_names)]


class _Lenient(BaseModel):
    """Stats bodies ignore unknown fields: a newer client's extra counter must not cost a run its
    stats, and a stats file written by a newer kcache still reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)


def hit_rate(hits: int, misses: int, errors: int) -> float | None:
    """Percent of lookups that hit; errors count against it. None when there were no lookups."""
    lookups = hits + misses + errors
    return 100.0 * hits / lookups if lookups else None


_COUNTS = ("hits", "misses", "errors", "puts", "put_errors", "skipped", "bytes_down", "bytes_up")
_TIMES = ("seconds", "saved_s")


class LayerCounts(_Lenient):
    """One cache layer's counters, as kcache.store.counters counts them."""

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
    # hits by the tier that served them (wire.ServedBy: local, prefetch, service); they add up
    # to ``hits``, except in documents of clients before the tiers were counted (none there).
    served_by: Reasons = Field(default_factory=dict)

    @property
    def lookups(self) -> int:
        return self.hits + self.misses + self.errors

    @property
    def hit_rate(self) -> float | None:
        return hit_rate(self.hits, self.misses, self.errors)

    def plus(self, other: LayerCounts) -> LayerCounts:
        """Both added up: counters, times (rounded to a microsecond) and reasons."""
        values: dict[str, Any] = {k: getattr(self, k) + getattr(other, k) for k in _COUNTS}
        values.update({k: round(getattr(self, k) + getattr(other, k), 6) for k in _TIMES})
        for name in ("miss_reasons", "error_kinds", "served_by"):
            merged = dict(getattr(self, name))
            for reason, n in getattr(other, name).items():
                merged[reason] = merged.get(reason, 0) + n
            values[name] = _cap_reasons(merged)
        return LayerCounts(**values)


def _cap_reasons(reasons: dict[str, int], limit: int = _MAX_REASONS) -> dict[str, int]:
    """Keep the most frequent reasons within the model's bound; lump the rest into "other"."""
    if len(reasons) <= limit:
        return reasons
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(ranked[: limit - 1])
    kept["other"] = kept.get("other", 0) + sum(n for _k, n in ranked[limit - 1 :])
    return kept


Layers = Annotated[dict[_StatName, LayerCounts], Field(max_length=64), AfterValidator(_stat_names)]


def total(layers: Iterable[LayerCounts]) -> LayerCounts:
    """Every layer's counters in one."""
    out = LayerCounts()
    for counts in layers:
        out = out.plus(counts)
    return out


def saved_estimate(layers: Mapping[str, LayerCounts]) -> float:
    """Compile time saved, estimated: the largest layer's credit, not their sum.

    A hit credits the compile time its producer recorded, and those times nest: an AOTAutograd
    entry's time covers Inductor's compiles of its graphs (``fx-graph``), whose time covers the
    Triton kernels (``kernel``: the graph's compile time shared among its kernels), host modules
    and C++ modules (``jit``) built for them; a Dynamo package covers all of it. Added up they
    counted the same seconds two or three times ("15.9 s saved" where the first call went from
    17.24 to 10.70 s). Still an upper bound: loading what was served costs some of it back."""
    return round(max((c.saved_s for c in layers.values()), default=0.0), 6)


def sum_layer_counts(many: Iterable[dict[str, LayerCounts]]) -> dict[str, LayerCounts]:
    """Per-layer counters of many processes added up, layers in name order."""
    totals: dict[str, LayerCounts] = {}
    for layers in many:
        for name, counts in layers.items():
            totals[name] = totals[name].plus(counts) if name in totals else counts
    return dict(sorted(totals.items()))


# ---- where start-up time goes, and what was installed but not used --------------------------

_MAX_PHASES = 64
Phases = Annotated[
    dict[_ReasonName, Annotated[float, Field(ge=0)]], Field(max_length=_MAX_PHASES), AfterValidator(_reason_names)
]
# kind -> reason -> count: "fetched_unused" (an entry or kernel brought into the process that no
# compile asked for), "emitted_then_compiled" (a kernel kcache wrote that Triton compiled anyway),
# "refused" (an entry or kernel kcache would not hand over: signature, target, bad pack),
# "quarantined" (torch could not load what kcache handed over), "unprofitable" (a Dynamo package
# that did not pay: kcache.layers.dynamo.payoff).
Verification = Annotated[dict[_StatName, Reasons], Field(max_length=16), AfterValidator(_stat_names)]

# Where a run's id came from: the variable's name, KCACHE_RUN_ID or the launcher variable the
# client derived it from when KCACHE_RUN_ID was unset (kcache.host.launchers), e.g. GITHUB_RUN_ID,
# SLURM_JOB_ID, TORCHELASTIC_RUN_ID.
RunSource = Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]{0,63}$", description="where the run id came from: KCACHE_RUN_ID, or the launcher variable it was derived from (GITHUB_RUN_ID, CI_JOB_ID, BUILDKITE_JOB_ID, BUILD_TAG, SLURM_JOB_ID, TORCHELASTIC_RUN_ID, JOB_COMPLETION_INDEX, HOSTNAME)")]

# Torch's own phase timers (``dynamo_timed`` names, which differ between torch versions) grouped
# for people; the first matching rule wins. The timers nest (Dynamo's compile contains
# AOTAutograd, which contains Inductor, which contains the kernel compiles), so a group's time is
# its outermost timer's (the largest), and the groups overlap rather than add up.
PHASE_GROUPS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("kernel emit (TritonBundler)", ("TritonBundler.read_and_emit",)),
    ("autotune / benchmarking", ("benchmark", "autotune", "coordesc", "coordinate_descent")),
    ("kernel compiles (Triton, C++)", ("async_compile", "compile_file", "triton.compile")),
    ("Inductor cache load", ("fx_graph_cache", "FxGraphCache", "inductor_load", "load_with_key", "after_deserialization",
                             "AOTAutogradCache", "autograd_cache")),
    ("Inductor lowering + codegen", ("compile_fx", "fw_compiler", "bw_compiler", "fx_codegen", "GraphLowering", "Scheduler",
                                     "PyCodeCache", "codegen")),
    ("AOTAutograd", ("create_aot_dispatcher_function", "aot_", "joint_graph")),
    ("Dynamo", ("_compile.compile_inner", "compile_attempt", "bytecode_tracing", "build_guards", "OutputGraph",
                "precompile", "variable_builder", "dynamo")),
)


def phase_group(name: str) -> str:
    """The group a phase timer belongs to ("other" if none)."""
    for group, needles in PHASE_GROUPS:
        if any(needle in name for needle in needles):
            return group
    return "other"


def group_phases(phases: dict[str, float]) -> dict[str, float]:
    """Seconds per group (``PHASE_GROUPS``): its outermost (largest) timer, largest group first.
    Timers no rule knows are left out rather than guessed."""
    groups: dict[str, float] = {}
    for name, seconds in phases.items():
        group = phase_group(name)
        if group != "other":
            groups[group] = max(groups.get(group, 0.0), round(seconds, 6))
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def sum_phases(many: Iterable[dict[str, float]]) -> dict[str, float]:
    """Phase seconds of many processes added up; the largest ``_MAX_PHASES`` kept."""
    acc: dict[str, float] = {}
    for phases in many:
        for name, seconds in phases.items():
            acc[name] = acc.get(name, 0.0) + seconds
    ranked = sorted(acc.items(), key=lambda kv: -kv[1])[:_MAX_PHASES]
    return {name: round(seconds, 6) for name, seconds in sorted(ranked)}


def sum_verification(many: Iterable[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    acc: dict[str, dict[str, int]] = {}
    for verification in many:
        for kind, reasons in verification.items():
            mine = acc.setdefault(kind, {})
            for reason, n in reasons.items():
                mine[reason] = mine.get(reason, 0) + n
    return {kind: _cap_reasons(reasons) for kind, reasons in sorted(acc.items())}


class EnvironmentSummary(_Lenient):
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

    def plus(self, other: EnvironmentSummary) -> EnvironmentSummary:
        n, h, m, e = (self.processes + other.processes, self.hits + other.hits, self.misses + other.misses,
                      self.errors + other.errors)
        return EnvironmentSummary(torch=self.torch, triton=self.triton, processes=n, hits=h, misses=m, errors=e,
                                  hit_rate=hit_rate(h, m, e))


def environment_of(env: EnvFingerprint | None, layers: dict[str, LayerCounts]) -> EnvironmentSummary:
    """One process's environment summary: its fingerprint's torch/triton and its lookups."""
    t = total(layers.values())
    return EnvironmentSummary(
        torch=env.torch if env else None, triton=env.triton if env else None, processes=1,
        hits=t.hits, misses=t.misses, errors=t.errors, hit_rate=t.hit_rate,
    )


def merge_environments(many: Iterable[EnvironmentSummary]) -> list[EnvironmentSummary]:
    """Per (torch, triton): processes and lookups added up, newest torch first."""
    acc: dict[tuple[str | None, str | None], EnvironmentSummary] = {}
    for env in many:
        key = (env.torch, env.triton)
        acc[key] = acc[key].plus(env) if key in acc else env
    return sorted(acc.values(), key=lambda s: (s.torch or "", s.triton or ""), reverse=True)


class StatsDocument(_Lenient):
    """The counts of one process (``processes == 1``, with its ``host``, ``pid`` and
    ``environment``) or of many merged (a stats file shared by ranks, a run on the service, with
    their ``environments``). What ``KCACHE_STATS_FILE`` holds and every report reads."""

    format: Literal["kcache-stats"] = STATS_FORMAT
    version: int = STATS_VERSION
    processes: int = Field(default=1, ge=0)
    host: str | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    run_id: str | None = None
    run_source: RunSource | None = None
    namespace: str | None = None
    workload: str | None = None
    workloads: list[str] = Field(default_factory=list)
    environment: EnvFingerprint | None = None
    environments: list[EnvironmentSummary] = Field(default_factory=list)
    layers: Layers = Field(default_factory=dict)
    missed: list[MissRecord] = Field(default_factory=list, max_length=MAX_MISS_RECORDS, description="lookups that missed, for kcache explain")
    phases: Phases = Field(default_factory=dict)
    verification: Verification = Field(default_factory=dict)

    def totals(self) -> LayerCounts:
        """Every layer added up, except the compile time saved: :func:`saved_estimate`."""
        return total(self.layers.values()).model_copy(update={"saved_s": saved_estimate(self.layers)})

    @property
    def hit_rate(self) -> float | None:
        return self.totals().hit_rate

    def environment_summaries(self) -> list[EnvironmentSummary]:
        """This document's per-environment lookups: a merged one lists them; a process's own
        document has its fingerprint and its layers."""
        if self.environments:
            return list(self.environments)
        if self.processes == 1 and (self.environment is not None or self.layers):
            return [environment_of(self.environment, self.layers)]
        return []

    @classmethod
    def merge(cls, docs: Iterable[StatsDocument]) -> StatsDocument:
        """One document for many: counters add up, ``processes`` counts every process merged in;
        run id, namespace, workload and environment stay where all agree."""
        docs = list(docs)
        starts = [d.started_at for d in docs if d.started_at]
        ends = [d.ended_at for d in docs if d.ended_at]

        def agreed(values: Iterable[str | None]) -> str | None:
            found = sorted({v for v in values if v})
            return found[0] if len(found) == 1 else None

        workloads = sorted({w for d in docs for w in [d.workload, *d.workloads] if w})
        fingerprints = {d.environment.id: d.environment for d in docs if d.environment is not None}
        same_environment = len(fingerprints) == 1 and all(d.environment is not None for d in docs)
        return cls(
            processes=sum(d.processes for d in docs),
            started_at=min(starts) if starts else None,
            ended_at=max(ends) if ends else None,
            run_id=agreed(d.run_id for d in docs),
            run_source=agreed(d.run_source for d in docs),
            namespace=agreed(d.namespace for d in docs),
            workload=workloads[0] if len(workloads) == 1 else None,
            workloads=workloads,
            environment=next(iter(fingerprints.values())) if same_environment else None,
            environments=merge_environments(e for d in docs for e in d.environment_summaries()),
            layers=sum_layer_counts(d.layers for d in docs),
            missed=merge_misses(d.missed for d in docs),
            phases=sum_phases(d.phases for d in docs),
            verification=sum_verification(d.verification for d in docs),
        )


# ---- runs on the service (cache-hit metrics per CI job / training run) ------------------------


class RunStatsReport(_Lenient):
    """What one process sends at exit to its run (``wire.RUN_STATS``).

    ``report_id`` is chosen by the client, so a retried POST stores one contribution, not two."""

    report_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{8,64}$")
    host: str = Field(default="", max_length=255)
    pid: int = Field(default=0, ge=0)
    workload: WorkloadName | None = None
    run_source: RunSource | None = None
    kcache_version: str | None = Field(default=None, max_length=64)
    started_at: float = Field(default=0.0, ge=0)
    ended_at: float = Field(default=0.0, ge=0)
    environment: EnvFingerprint | None = Field(default=None, description="torch, triton, CUDA/HIP and GPU arch of the process")
    layers: Layers = Field(default_factory=dict)
    missed: list[MissRecord] = Field(default_factory=list, max_length=MAX_MISS_RECORDS, description="lookups that missed, for kcache explain")
    phases: Phases = Field(default_factory=dict)
    verification: Verification = Field(default_factory=dict)

    def document(self) -> StatsDocument:
        return StatsDocument(
            processes=1, host=self.host, pid=self.pid, started_at=self.started_at or None,
            ended_at=self.ended_at or None, workload=self.workload, run_source=self.run_source,
            environment=self.environment, layers=self.layers,
            missed=self.missed, phases=self.phases, verification=self.verification,
        )


class RunSummary(_Lenient):
    """One run (e.g. a CI job), summed over every process that reported into it."""

    run_id: RunId
    run_source: RunSource | None = None
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
    missed: list[MissRecord] = Field(default_factory=list)
    phases: dict[str, float] = Field(default_factory=dict)
    phase_groups: dict[str, float] = Field(default_factory=dict, description="phases grouped (Dynamo, AOTAutograd, ...)")
    verification: dict[str, dict[str, int]] = Field(default_factory=dict)

    @classmethod
    def of(cls, namespace: str, run_id: str, doc: StatsDocument) -> RunAggregate:
        """The run as the service answers it, from the merged document of its reports."""
        t = doc.totals()
        return cls(
            run_id=run_id, run_source=doc.run_source, namespace=namespace, workload=doc.workload, workloads=doc.workloads,
            processes=doc.processes, started_at=doc.started_at or 0.0, ended_at=doc.ended_at or 0.0,
            hits=t.hits, misses=t.misses, errors=t.errors, puts=t.puts, bytes_down=t.bytes_down,
            bytes_up=t.bytes_up, seconds=t.seconds, saved_s=t.saved_s, hit_rate=t.hit_rate,
            environments=doc.environment_summaries(), layers=doc.layers,
            missed=doc.missed, phases=doc.phases, phase_groups=group_phases(doc.phases), verification=doc.verification,
        )

    def summary(self) -> RunSummary:
        return RunSummary.model_validate(self.model_dump(exclude={"layers", "missed", "phases", "phase_groups", "verification"}))

    def document(self) -> StatsDocument:
        """The run as a stats document, for the same reports a stats file gets."""
        return StatsDocument(
            processes=self.processes, started_at=self.started_at or None, ended_at=self.ended_at or None,
            run_id=self.run_id, run_source=self.run_source, namespace=self.namespace, workload=self.workload, workloads=self.workloads,
            environments=self.environments, layers=self.layers,
            missed=self.missed, phases=self.phases, verification=self.verification,
        )


class RunList(_Lenient):
    items: list[RunSummary]
