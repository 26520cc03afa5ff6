"""The one fail-open boundary between kcache and the process it lives in.

kcache runs inside other people's training and inference jobs. Nothing of kcache may raise into
torch or Triton: every hook runs torch's own code unguarded (its exceptions are torch's to raise)
and kcache's own work inside :func:`guard`, which turns any exception of ours into one warning per
kind and lets the original behaviour stand. Inductor's ``remote_cache.py`` has the same single
boundary for its backends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("kcache")
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(what: str, exc: BaseException | None = None) -> None:
    """Log ``what`` once per process (a fleet of thousands must not flood its logs)."""
    with _warned_lock:
        if what in _warned:
            return
        _warned.add(what)
    log.warning("kcache: %s%s (kcache stays out of the way)", what, f": {type(exc).__name__}: {exc}" if exc else "")


@contextmanager
def guard(what: str) -> Iterator[None]:
    """Run kcache's part of a hook; an exception of ours is warned about once and swallowed.

    Only ``Exception``: KeyboardInterrupt and SystemExit belong to the user."""
    try:
        yield
    except Exception as exc:
        warn_once(what, exc)
