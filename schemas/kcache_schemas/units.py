"""The one spelling of sizes and durations, for every setting and command of kcache.

The client's settings (``KCACHE_LOCAL_MAX_BYTES``, ``KCACHE_*_S``), the service's
(``KCACHE_MAX_PACK_BYTES``, ``KCACHE_RETENTION``'s limits and ages, ...) and the CLI
(``kcache gc --max-bytes 40GB --older-than 7d``) all parse here, so ``10G`` means one thing.

Sizes: a whole number of bytes (``1048576``), or a number with a unit, case-insensitive,
with or without a space:

* ``kB`` ``MB`` ``GB`` ``TB``: powers of 1000 (``10GB`` = 10·10⁹ bytes);
* ``KiB`` ``MiB`` ``GiB`` ``TiB`` (and Kubernetes' ``Ki`` ``Mi`` ``Gi`` ``Ti``): powers of 1024;
* ``K`` ``M`` ``G`` ``T`` alone: powers of 1024 (``10G`` = 10 GiB), as sccache's
  ``SCCACHE_CACHE_SIZE`` and most cache-size settings read them;
* ``B`` is bytes.

Durations: a number with a unit, ``ms`` ``s`` ``m`` ``h`` ``d`` ``w`` (``90s``, ``30m``, ``12h``,
``7d``, ``2w``), parts may be combined (``1h30m``). A bare number is seconds where the name says so
(``KCACHE_READ_TIMEOUT_S``, retention's JSON); the CLI's ``gc`` flags refuse one (``--older-than
7`` was 7 seconds to the old CLI and 7 days to its reader), except ``0``.

Fractions (``KCACHE_CANARY``: the share of cache hits audited): a number from 0 to 1 (``0.01``),
or a percentage (``1%``, ``0.5%``); ``1`` is every one, a bare number above 1 is refused (``5``
could mean 5 % or all of them).

Negative, fractional byte counts, non-finite numbers and anything else are refused with a
:class:`ValueError` that says what would have been accepted.
"""

from __future__ import annotations

import math
import re

_KB, _KIB = 1000, 1024
BYTE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": _KB, "mb": _KB**2, "gb": _KB**3, "tb": _KB**4,
    "kib": _KIB, "mib": _KIB**2, "gib": _KIB**3, "tib": _KIB**4,
    "ki": _KIB, "mi": _KIB**2, "gi": _KIB**3, "ti": _KIB**4,
    "k": _KIB, "m": _KIB**2, "g": _KIB**3, "t": _KIB**4,
}
DURATION_UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}

BYTES_HELP = "bytes (1048576), or a number with a unit: 500MB, 10GB (powers of 1000), 512MiB, 10GiB (powers of 1024); 10G = 10GiB"
DURATION_HELP = "a number with a unit: 500ms, 90s, 30m, 12h, 7d, 2w, or combined: 1h30m"

_BYTES_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)")
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?|\.\d+")
_DURATION_PART = r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d|w)\s*"
_DURATION_PART_RE = re.compile(_DURATION_PART)
_DURATION_RE = re.compile(f"(?:{_DURATION_PART})+")


def parse_bytes(value: str | int | float) -> int:
    """A size in bytes (see the module's grammar). Raises ValueError naming what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; use {BYTES_HELP}")
    if isinstance(value, (int, float)):  # from JSON: a number of bytes
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise ValueError(f"{value!r} is not a size: a size is a whole number of bytes, not negative")
        return int(value)
    text = value.strip().lower()
    m = _BYTES_RE.fullmatch(text)
    if m is None or m.group(2) not in ("", *BYTE_UNITS):
        why = "a size must not be negative" if text.startswith("-") else "not a size"
        raise ValueError(f"{value[:40]!r}: {why}; use {BYTES_HELP}")
    number, unit = m.group(1), m.group(2)
    if unit in ("", "b") and "." in number:
        raise ValueError(f"{value[:40]!r}: a number of bytes is a whole number; use {BYTES_HELP}")
    return int(float(number) * BYTE_UNITS[unit or "b"])


def parse_duration(value: str | int | float, *, bare_seconds: bool = True) -> float:
    """Seconds (see the module's grammar). ``bare_seconds=False``: a bare number other than 0 is
    refused (where a reader could take ``7`` for days). Raises ValueError naming what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use {DURATION_HELP}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value!r} is not a duration: it must be a finite number of seconds, not negative")
        return float(value)
    text = value.strip().lower()
    if _NUMBER_RE.fullmatch(text):
        seconds = float(text)
        if bare_seconds or seconds == 0:
            return seconds
        raise ValueError(f"{value[:40]!r} has no unit: write {text}s, {text}m, {text}h or {text}d")
    if _DURATION_RE.fullmatch(text) is None:
        why = "a duration must not be negative" if text.startswith("-") else "not a duration"
        raise ValueError(f"{value[:40]!r}: {why}; use {DURATION_HELP}" + ("; a bare number is seconds" if bare_seconds else ""))
    return sum(float(n) * DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(text))


FRACTION_HELP = "a fraction from 0 to 1 (0.01) or a percentage (1%, 0.5%)"


def parse_fraction(value: str | int | float) -> float:
    """A share in [0, 1] (see the module's grammar). Raises ValueError naming what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a fraction; use {FRACTION_HELP}")
    if isinstance(value, (int, float)):
        number, percent = float(value), False
    else:
        text = value.strip()
        percent = text.endswith("%")
        body = text.removesuffix("%").strip()
        if _NUMBER_RE.fullmatch(body) is None:
            why = "a fraction must not be negative" if body.startswith("-") else "not a fraction"
            raise ValueError(f"{value[:40]!r}: {why}; use {FRACTION_HELP}")
        number = float(body)
    share = number / 100 if percent else number
    if not math.isfinite(share) or not 0 <= share <= 1:
        hint = f"; write {number:g}% for {number:g} percent" if not percent and 1 < number <= 100 else ""
        raise ValueError(f"{str(value)[:40]!r}: a fraction is from 0 to 1 (0 % to 100 %){hint}; use {FRACTION_HELP}")
    return share


def format_bytes(n: int | float) -> str:
    """``12.3 kB``, ``4.5 MB``, ``812 B``: powers of 1000, as ``ls -h --si`` and the dashboard."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def format_duration(seconds: float) -> str:
    """``7d``, ``1.5h``, ``30s``: what :func:`parse_duration` reads back."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            value = seconds / size
            return f"{value:.0f}{unit}" if value >= 10 or value == int(value) else f"{value:.1f}{unit}"
    return f"{seconds:.0f}s"
