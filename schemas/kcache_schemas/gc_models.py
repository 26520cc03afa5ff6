"""Retention on the wire: storage budgets, GC requests and reports, pins. Sizes and durations
(``50GiB``, ``7d``) are spelled as :mod:`kcache_schemas.units` says, everywhere.

The service keeps each namespace under its budget by evicting the least recently used kernels
and entries (see docs/storage.md, "Retention"); these models are what ``GET/POST
/v1/{namespace}/gc`` and ``/v1/{namespace}/pins`` exchange.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kcache_schemas.models import WorkloadName

# Why an item is evicted, in the order the GC applies them (each item counts under the first).
REASON_ENV = "env"  # built for an environment nobody uses any more (or the one --env names)
REASON_TTL = "ttl"  # not used for longer than the namespace's TTL (or --older-than)
REASON_BUDGET = "budget"  # least recently used, while the namespace is over its byte budget
REASON_ORPHAN = "orphan"  # a blob no index record references (a crash mid-write, a lost race)
REASONS = (REASON_ENV, REASON_TTL, REASON_BUDGET, REASON_ORPHAN)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetentionPolicy(_Model):
    """One namespace's storage rules as the service applies them. Sizes count the kernels and
    entries the namespace's records name (a blob shared by two namespaces counts in both)."""

    soft_limit_bytes: int | None = Field(default=None, description="background GC keeps usage under this")
    hard_limit_bytes: int | None = Field(default=None, description="an upload past this is refused with 507")
    min_age_s: float = Field(default=3600.0, description="nothing used more recently than this is evicted")
    ttl_s: float | None = Field(default=None, description="evict what was not used for this long")
    env_idle_s: float | None = Field(default=None, description="purge an environment nobody used for this long")


# The environment fields a GC's ``env`` selector may name (``arch`` is ``gpu_arch``), and the
# selector's form: an environment id, or field=value pairs (field names in any case).
ENV_FIELDS = ("torch", "triton", "cuda", "hip", "gpu_arch")


def _any_case(word: str) -> str:
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


_ENV_PAIR = rf"\s*(?:{'|'.join(_any_case(n) for n in (*ENV_FIELDS, 'arch'))})\s*=[^,]*[^,\s][^,]*"
ENV_SELECTOR_PATTERN = rf"^\s*(?:[0-9a-f]{{16}}|{_ENV_PAIR}(?:,{_ENV_PAIR})*)\s*$"


def _whole_number(value: object) -> object:
    """JSON Schema's integers include ``3.0``; strict validation would refuse it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


_ByteCount = Annotated[int, Field(ge=0), BeforeValidator(_whole_number)]


class GcRequest(_Model):
    """A GC run: the namespace's policy, with any of these overriding it. Strict: ``true`` is
    not a number of seconds here (it read as 1 s)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_bytes: _ByteCount | None = Field(default=None, description="evict least recently used until at most this many bytes")
    min_age_s: float | None = Field(default=None, ge=0, description="0 allows evicting items used just now")
    older_than_s: float | None = Field(default=None, gt=0, description="with env: only what is idle this long; alone: a TTL")
    # The pattern is documentation: the service parses the selector itself, to answer a bad one
    # with what the form is (400), and an id no run in the namespace has with 404.
    env: str | None = Field(default=None, min_length=1, max_length=256, json_schema_extra={"pattern": ENV_SELECTOR_PATTERN},
                            description="an environment id (kcache ls --workloads) or torch=..,triton=..,cuda=..,hip=..,gpu_arch=..")
    orphans: bool = Field(default=False, description="also delete blobs no record references")
    dry_run: bool = False


class Amount(_Model):
    entries: int = 0
    bytes: int = 0

    def plus(self, size: int, entries: int = 1) -> Amount:
        return Amount(entries=self.entries + entries, bytes=self.bytes + size)


class GcItem(_Model):
    kind: str
    key: str
    size: int
    last_used: float = Field(description="last access, or creation if never read (unix seconds)")
    reason: str


class GcReport(_Model):
    """What a GC run planned and did. On a dry run ``evicted`` is empty and ``after`` is the plan's."""

    namespace: str
    trigger: str = Field(description="api, schedule or pressure (an upload met the hard limit)")
    dry_run: bool
    policy: RetentionPolicy = Field(description="the rules applied: the namespace's, with the request's overrides")
    target_bytes: int | None = None
    env: dict[str, str] | None = Field(default=None, description="the environment purged (fields that must match)")
    started_at: float
    seconds: float = 0.0
    before: Amount
    after: Amount
    planned: dict[str, Amount] = Field(default_factory=dict, description="by reason")
    evicted: dict[str, Amount] = Field(default_factory=dict, description="by reason")
    skipped: int = Field(default=0, description="planned, but used or replaced meanwhile: kept")
    kept_recent: Amount = Amount()
    kept_pinned: Amount = Amount()
    pins: list[str] = Field(default_factory=list)
    oldest_used: float | None = Field(default=None, description="last use of the least recently used item left")
    blobs_deleted: Amount = Amount()
    blobs_shared: int = Field(default=0, description="blobs kept: another record (maybe in another namespace) still uses them")
    orphans: Amount = Amount()
    items: list[GcItem] = Field(default_factory=list, description="the first planned evictions")
    more_items: int = 0
    notes: list[str] = Field(default_factory=list)


class GcStatus(_Model):
    namespace: str
    policy: RetentionPolicy
    usage: Amount = Field(description="kernels and entries stored now")
    pins: list[str] = Field(default_factory=list)
    last_run: GcReport | None = None


class Pin(_Model):
    workload: WorkloadName
    pinned_at: datetime


class PinList(_Model):
    items: list[Pin]
