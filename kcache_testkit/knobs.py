"""The test suite's own settings, read strictly.

A suite knob that does not parse is an error naming it, as kcache's settings are: a typo in
``KCACHE_HOST_SAFETY_RUNS`` must not silently run the race tests some other number of times.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

_ON = frozenset({"1", "on", "true", "yes"})
_OFF = frozenset({"0", "off", "false", "no"})


class KnobError(ValueError):
    """A suite setting that does not parse; the message names it."""


def count(name: str, default: int, environ: Mapping[str, str] = os.environ) -> int:
    """A whole number >= 1 from ``environ[name]``, ``default`` when unset."""
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise KnobError(f"{name}={raw!r}: expected a whole number >= 1") from None
    if value < 1:
        raise KnobError(f"{name}={raw!r}: expected a whole number >= 1")
    return value


def switch(name: str, default: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """On or off from ``environ[name]`` (1/0, on/off, true/false, yes/no), ``default`` when unset."""
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise KnobError(f"{name}={raw!r}: expected 1 or 0 (on or off)")
