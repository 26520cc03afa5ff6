"""Retention rules: how much each namespace may store and for how long (``KCACHE_RETENTION``, a
JSON object, or ``KCACHE_RETENTION_FILE``, a JSON file)::

    {
      "default":    {"soft_limit": "40GiB", "hard_limit": "50GiB", "min_age": "1h", "env_idle": "14d"},
      "namespaces": {"ci": {"soft_limit": "5GiB", "hard_limit": "8GiB", "ttl": "7d"}},
      "gc_interval": "5m", "orphan_interval": "24h", "orphan_min_age": "1h"
    }

A namespace's entry overrides the fields it names, the rest come from ``default``. Sizes take
``500MB``/``50GiB`` or bytes, durations ``90s``/``30m``/``12h``/``7d`` or seconds. What each rule
does is in docs/storage.md ("Retention"); :mod:`kcache_server.store.gc` applies them.
"""

from __future__ import annotations

from typing import Annotated, Any

from kcache_schemas import validate_namespace
from kcache_schemas.gc_models import RetentionPolicy
from kcache_schemas.units import parse_bytes, parse_duration
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    field_validator,
    model_validator,
)

ByteSize = Annotated[int, BeforeValidator(parse_bytes)]
Duration = Annotated[float, BeforeValidator(parse_duration)]
DEFAULT_MIN_AGE_S = 3600.0
# With only a hard limit, the background GC keeps usage this far below it.
SOFT_OF_HARD = 0.9


class NamespaceRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    soft_limit: ByteSize | None = None
    hard_limit: ByteSize | None = None
    min_age: Duration = DEFAULT_MIN_AGE_S
    ttl: Duration | None = None
    env_idle: Duration | None = None

    @model_validator(mode="after")
    def _limits_in_order(self) -> NamespaceRules:
        if self.soft_limit is not None and self.hard_limit is not None and self.soft_limit > self.hard_limit:
            raise ValueError(f"soft_limit ({self.soft_limit}) is above hard_limit ({self.hard_limit})")
        return self


class RetentionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: NamespaceRules = NamespaceRules()
    namespaces: dict[str, NamespaceRules] = {}
    gc_interval: Duration = 300.0
    orphan_interval: Duration | None = 86400.0
    orphan_min_age: Duration = 3600.0

    @field_validator("namespaces")
    @classmethod
    def _valid_names(cls, v: dict[str, NamespaceRules]) -> dict[str, NamespaceRules]:
        for name in v:
            validate_namespace(name)
        return v

    @model_validator(mode="after")
    def _merged_limits_in_order(self) -> RetentionConfig:
        for name in self.namespaces:  # an override of one limit must still fit the other
            p = self.policy(name)
            if p.soft_limit_bytes is not None and p.hard_limit_bytes is not None and p.soft_limit_bytes > p.hard_limit_bytes:
                raise ValueError(f"namespaces.{name}: soft limit {p.soft_limit_bytes} is above the hard limit {p.hard_limit_bytes}")
        return self

    @property
    def active(self) -> bool:
        """Whether any namespace has a rule the background GC applies."""
        return any(_active(r) for r in (self.default, *self.namespaces.values()))

    def policy(self, namespace: str) -> RetentionPolicy:
        fields = self.default.model_dump()
        override = self.namespaces.get(namespace)
        if override is not None:
            fields.update(override.model_dump(exclude_unset=True))
        rules = NamespaceRules.model_construct(**fields)
        soft = rules.soft_limit
        if soft is None and rules.hard_limit is not None:
            soft = int(rules.hard_limit * SOFT_OF_HARD)
        return RetentionPolicy(
            soft_limit_bytes=soft, hard_limit_bytes=rules.hard_limit, min_age_s=rules.min_age,
            ttl_s=rules.ttl, env_idle_s=rules.env_idle,
        )


def _active(rules: NamespaceRules) -> bool:
    return any(v is not None for v in (rules.soft_limit, rules.hard_limit, rules.ttl, rules.env_idle))


def policy_active(policy: RetentionPolicy) -> bool:
    return any(v is not None for v in (policy.soft_limit_bytes, policy.hard_limit_bytes, policy.ttl_s, policy.env_idle_s))


def parse_retention(raw: Any, source: str) -> RetentionConfig:
    """Parse the JSON value of ``source``; a ValueError with one line naming the first problem."""
    try:
        return RetentionConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise ValueError(f"{source}: {where + ': ' if where else ''}{msg}") from None
