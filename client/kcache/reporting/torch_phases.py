"""Where a process's start-up time went, from torch's own phase timers.

Dynamo, AOTAutograd and Inductor time their phases with ``dynamo_timed``, which adds each
duration to ``torch._dynamo.utils.compilation_time_metrics`` (name -> list of seconds; the names
differ between torch versions). kcache reads that table once at exit, only if torch imported it
(never importing anything itself), and keeps the totals in the stats document, where
``kcache stats`` and the dashboard group them (``kcache_schemas.stats_document.PHASE_GROUPS``): the
largest ones the document holds (a process that loads a Dynamo package and then traces again
runs more than 64 distinct timers; the document refused them all, and the process wrote no stats).
"""

from __future__ import annotations

from kcache_schemas.stats_document import sum_phases

from kcache.host.after_import import imported
from kcache.host.failopen import guard


def torch_phases() -> dict[str, float]:
    """Seconds per torch phase timer in this process so far; empty where torch never compiled."""
    with guard("could not read torch's phase timers"):
        utils = imported("torch._dynamo.utils")
        metrics = getattr(utils, "compilation_time_metrics", None) if utils is not None else None
        if not isinstance(metrics, dict):
            return {}
        out: dict[str, float] = {}
        for name, durations in list(metrics.items()):
            if isinstance(name, str) and 1 <= len(name) <= 128 and isinstance(durations, list):
                seconds = sum(d for d in durations if isinstance(d, (int, float)))
                if seconds > 0:
                    out[name] = round(float(seconds), 6)
        return sum_phases([out])
    return {}
