"""Client configuration from ``KCACHE_*`` environment variables (or ``kcache.install(...)``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Mode = Literal["readwrite", "readonly", "off"]
_MODES = ("readwrite", "readonly", "off")


def _float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class ClientConfig:
    url: str | None = None
    token: str | None = field(default=None, repr=False)
    namespace: str = "default"
    mode: Mode = "readwrite"
    # Deadlines are short on purpose: a cache that answers late is worse than a miss, because the
    # compile it should speed up is waiting on it.
    connect_timeout_s: float = 0.5
    read_timeout_s: float = 2.0
    retries: int = 1
    breaker_failures: int = 3
    breaker_reset_s: float = 30.0
    upload_queue: int = 1024
    flush_timeout_s: float = 5.0
    check_target: bool = True
    workload: str | None = None
    stats_file: str | None = None
    report: bool = False
    run_id: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.url) and self.mode != "off"

    @property
    def can_write(self) -> bool:
        return self.enabled and self.mode == "readwrite"

    @classmethod
    def from_env(cls, **overrides: Any) -> ClientConfig:
        mode = os.environ.get("KCACHE_MODE", "readwrite").lower()
        cfg = cls(
            url=os.environ.get("KCACHE_URL") or None,
            token=os.environ.get("KCACHE_TOKEN") or None,
            namespace=os.environ.get("KCACHE_NAMESPACE", "default"),
            mode=mode if mode in _MODES else "readwrite",  # type: ignore[arg-type]
            connect_timeout_s=_float("KCACHE_CONNECT_TIMEOUT_S", 0.5),
            read_timeout_s=_float("KCACHE_READ_TIMEOUT_S", 2.0),
            retries=_int("KCACHE_RETRIES", 1),
            breaker_failures=_int("KCACHE_BREAKER_FAILURES", 3),
            breaker_reset_s=_float("KCACHE_BREAKER_RESET_S", 30.0),
            upload_queue=_int("KCACHE_UPLOAD_QUEUE", 1024),
            flush_timeout_s=_float("KCACHE_FLUSH_TIMEOUT_S", 5.0),
            check_target=os.environ.get("KCACHE_CHECK_TARGET", "1") != "0",
            workload=os.environ.get("KCACHE_WORKLOAD") or None,
            stats_file=os.environ.get("KCACHE_STATS_FILE") or None,
            report=os.environ.get("KCACHE_REPORT", "0") == "1",
            run_id=os.environ.get("KCACHE_RUN_ID") or None,
        )
        return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
