"""Unsound keys: two compiles of one cache key that produced different output.

A key is sound when everything that changes a compile's output is part of it. The key-soundness
canary (``KCACHE_CANARY``, :mod:`kcache.layers.key_canary`) makes a node compile a sample of the entries it
would have been served and compare its own output with the served one. A difference means the
key misses a factor: the node reports an :class:`UnsoundReport`, the service quarantines the
entry for every node and keeps the report (both compiles' recorded key parts, context and
environments side by side), and ``kcache explain --key`` shows what differed and which recorded
inputs differ between the two compiles, the *suspects*: the missing factor is among them when it
was recorded at all (the parts of the key itself are equal by definition, unless the two sides
hashed other values to the same key).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from kcache_schemas.key_diff import Change, Component, KeyComponents, fingerprint_changes

MAX_DIFF_LINES: Final = 80  # of the normalised outputs' unified diff, kept in the report
MAX_DIFF_LINE_CHARS: Final = 240
MAX_LISTED: Final = 200  # unsound reports one listing answers


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class UnsoundReport(_Model):
    """What a node found when it compiled an entry's key itself: its output differs from the
    entry it would have been served. ``producer``: the parts the entry's producer recorded
    (None if it recorded none), ``consumer``: this node's, ``suspects``: the recorded inputs that
    differ between them."""

    layer: str = Field(max_length=64)
    key: str = Field(max_length=512, description="the entry's key as stored")
    compared: str = Field(max_length=512, description="what was compared, normalised how")
    served_digest: str = Field(max_length=128, description="sha256 of the served entry's normalised output")
    own_digest: str = Field(max_length=128, description="sha256 of this node's normalised output")
    output_diff: list[str] = Field(default_factory=list, max_length=MAX_DIFF_LINES)
    producer: KeyComponents | None = None
    consumer: KeyComponents
    suspects: list[Change] = Field(default_factory=list, max_length=4096)
    reporter: str | None = Field(default=None, max_length=256, description="kcache/<version> of the reporting client")
    reported_at: datetime | None = Field(default=None, description="set by the service")


class UnsoundList(_Model):
    items: list[UnsoundReport]
    more: bool = Field(default=False, description="more reports exist than listed")


def _merged(parts: KeyComponents) -> dict[str, Component]:
    return {**parts.context, **parts.components}


def suspects(producer: KeyComponents | None, consumer: KeyComponents) -> list[Change]:
    """Recorded inputs whose values differ between an entry's producer and a node whose own
    compile of the same key gave other output: key parts that differ or exist on one side only,
    then context both sides recorded that differs (context one side lacks is not a suspect: an
    older client records none), then the environments' fields."""
    if producer is None:
        return []
    stored, wanted = _merged(producer), _merged(consumer)
    changes = [
        Change(name=name, stored=stored[name].value if name in stored else None, wanted=part.value)
        for name, part in wanted.items()
        if (name in stored and stored[name].hash != part.hash) or (name not in stored and name in consumer.components)
    ]
    changes += [Change(name=name, stored=part.value, wanted=None) for name, part in producer.components.items() if name not in wanted]
    if producer.environment is not None and consumer.environment is not None:
        changes += [c.model_copy(update={"name": f"environment[{c.name}]"})
                    for c in fingerprint_changes(producer.environment, consumer.environment)]
    return changes


def unified_diff(served: str, own: str, served_name: str = "served", own_name: str = "own") -> list[str]:
    """The first lines of a unified diff of two normalised outputs, each line bounded."""
    import difflib

    lines = difflib.unified_diff(served.splitlines(), own.splitlines(), served_name, own_name, n=1, lineterm="")
    out: list[str] = []
    for line in lines:
        if len(out) >= MAX_DIFF_LINES:
            break
        out.append(line if len(line) <= MAX_DIFF_LINE_CHARS else line[:MAX_DIFF_LINE_CHARS] + "...")
    return out
