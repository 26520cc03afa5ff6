"""``kcache purge``: delete the cached entries whose recorded key parts match, for the day an
upstream key bug is announced ("torch 2.x left ``inductor_config[foo]`` out of the FX key").

The service scans the namespace's recorded key parts (the ``key-components`` layer: every key a
client compiled, with its parts, context, environment and run) and deletes each entry and kernel
whose parts match every condition, with its recorded parts. Conditions (``--where``, ANDed):

* ``<part>=<value>``: a key part or recorded context part by its name, as ``kcache explain``
  shows it (``inductor_config[max_autotune]=True``, ``options[num_warps]=8``);
* ``torch=``, ``triton=``, ``cuda=``, ``hip=``, ``gpu_arch=``: the environment it was compiled in;
* ``run=<id>``: the run id of the job that compiled it (its ``KCACHE_RUN_ID`` or its launcher's);
* ``producer_key=<key id>``: the key that signed the stored entry (``kcache inspect --entry``).

Entries stored without recorded parts (by clients older than the parts) are not selected.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

ENVIRONMENT_FIELDS: Final = ("torch", "triton", "cuda", "hip", "gpu_arch")
RUN: Final = "run"
PRODUCER_KEY: Final = "producer_key"
MAX_ITEMS: Final = 100  # listed in a report; the counts cover everything


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# NAME=VALUE where NAME is a key part (``word[...]``) or one of the fixed names: the rule
# parse_condition applies, as a JSON-schema pattern for the API's document.
_PART_NAME = r"[A-Za-z_][A-Za-z0-9_.]*\[[^=]*\]"
CONDITION_PATTERN: Final = rf"^(?:{_PART_NAME}|{'|'.join((*ENVIRONMENT_FIELDS, RUN, PRODUCER_KEY))})="
_CONDITION = re.compile(CONDITION_PATTERN)


def parse_condition(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` -> ``(NAME, VALUE)``; ValueError saying what is accepted."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"{text[:80]!r} is not a condition: use NAME=VALUE, e.g. 'inductor_config[max_autotune]=True', "
                         "torch=2.13.0, triton=3.9.0, run=ID or producer_key=ID")
    if _CONDITION.match(text) is None:
        raise ValueError(f"{name[:80]!r} is neither a key part (NAME[...], as kcache explain names it) nor one of "
                         f"{', '.join((*ENVIRONMENT_FIELDS, RUN, PRODUCER_KEY))}")
    return name, value


def _whole_number(value: object) -> object:
    """JSON Schema's integers include ``3.0``; strict validation would refuse it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class PurgeRequest(_Model):
    # Strict: ``"dry_run": 0`` or ``"false"`` is refused, not read as a boolean (a purge deletes).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # The pattern is for the API's document; the validator below checks it with a clear message.
    where: list[Annotated[str, Field(max_length=1024, json_schema_extra={"pattern": CONDITION_PATTERN})]] = Field(
        min_length=1, max_length=16, description="NAME=VALUE conditions, all must match")
    dry_run: bool = True
    max_scan: Annotated[int, BeforeValidator(_whole_number)] = Field(default=100_000, ge=1, le=10_000_000, description="recorded keys read at most")

    @field_validator("where")
    @classmethod
    def _conditions(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_condition(text)
        return value


class PurgeItem(_Model):
    layer: str
    key: str
    size: int = Field(ge=0)


class PurgeReport(_Model):
    namespace: str
    where: list[str]
    dry_run: bool
    scanned: int = Field(ge=0, description="recorded keys read")
    truncated: bool = Field(default=False, description="max_scan was reached: more may match")
    matched: int = Field(ge=0, description="cached entries and kernels whose recorded parts match")
    deleted: int = Field(default=0, ge=0)
    bytes: int = Field(default=0, ge=0, description="stored bytes of the matched entries")
    items: list[PurgeItem] = Field(default_factory=list, max_length=MAX_ITEMS)
    seconds: float = Field(default=0.0, ge=0)
