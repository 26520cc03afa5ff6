"""Client configuration from ``KCACHE_*`` environment variables (or ``kcache.install(...)``).

Every ``KCACHE_*`` variable the client reads is read here, with its default. The one exception is
``kcache._autoload``, which runs at every interpreter start and may import nothing but ``os`` and
``sys``: it reads its four switches (``KCACHE_URL``, ``KCACHE_MODE``, ``KCACHE_AUTOLOAD``,
``KCACHE_TRITON_MANAGER``, ``KCACHE_WORKLOAD``) itself, with the same defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from kcache.local_store import LocalEntryStore

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


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
DEFAULT_LOCAL_MAX_BYTES = 10 << 30  # as sccache's default: a few max-autotune models fit


def parse_bytes(raw: str) -> int:
    """``1073741824``, ``512M``, ``10G``, ``1.5GiB`` -> bytes. Raises ValueError."""
    text = raw.strip().lower().removesuffix("ib").removesuffix("b")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    value = float(text[: len(text) - len(unit)] if unit else text)
    if value < 0:
        raise ValueError(f"negative size {raw!r}")
    return int(value * _UNITS[unit])


def _bytes(name: str, default: int) -> int:
    try:
        return parse_bytes(os.environ[name]) if os.environ.get(name) else default
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
    signing_key: str | None = field(default=None, repr=False)  # HMAC secret (see kcache.signing)
    signing_private_key: str | None = field(default=None, repr=False)  # Ed25519: a PEM file, or the key itself
    trusted_keys: str | None = None  # Ed25519 public keys accepted: files and/or keys, comma-separated
    layers: str | None = None  # KCACHE_LAYERS as given: a comma list, "all" or "none"
    prefetch_wait_s: float = 30.0
    coordesc_reuse: bool = True
    triton_manager: bool = True
    local_dir: str | None = None
    local_max_bytes: int = DEFAULT_LOCAL_MAX_BYTES  # 0: unbounded
    require_hit: Literal["warn", "fail"] | None = None  # see kcache.require_hit

    def local_root(self) -> Path:
        return Path(self.local_dir) if self.local_dir else default_local_dir()

    def local_store(self) -> LocalEntryStore:
        """The local tier of this service and namespace, bounded as configured."""
        from kcache.local_store import LocalEntryStore

        return LocalEntryStore(self.local_root(), self.namespace, url=self.url, max_bytes=self.local_max_bytes or None)

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
            signing_key=os.environ.get("KCACHE_SIGNING_KEY") or None,
            signing_private_key=os.environ.get("KCACHE_SIGNING_PRIVATE_KEY") or None,
            trusted_keys=os.environ.get("KCACHE_TRUSTED_KEYS") or None,
            layers=os.environ.get("KCACHE_LAYERS"),
            prefetch_wait_s=_float("KCACHE_PREFETCH_WAIT_S", 30.0),
            coordesc_reuse=os.environ.get("KCACHE_COORDESC_REUSE", "1") != "0",
            triton_manager=os.environ.get("KCACHE_TRITON_MANAGER", "1") != "0",
            local_dir=os.environ.get("KCACHE_LOCAL_DIR") or None,
            local_max_bytes=_bytes("KCACHE_LOCAL_MAX_BYTES", DEFAULT_LOCAL_MAX_BYTES),
            require_hit=_require_hit(os.environ.get("KCACHE_REQUIRE_HIT", "")),
        )
        return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


def _require_hit(raw: str) -> Literal["warn", "fail"] | None:
    """``warn``/``fail``; unset, ``0`` or ``off`` is off; anything else warns (a typo of ``fail``
    must not switch the guard off silently)."""
    value = raw.strip().lower()
    if value in ("", "0", "off", "false", "no"):
        return None
    return "fail" if value == "fail" else "warn"


def default_local_dir() -> Path:
    """kcache's local tier: ``$KCACHE_LOCAL_DIR``, else ``$XDG_CACHE_HOME/kcache/client``, else
    ``~/.cache/kcache/client``."""
    if d := os.environ.get("KCACHE_LOCAL_DIR"):
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kcache" / "client"


def gpu_arch_override() -> str | None:
    """``KCACHE_GPU_ARCH`` (``sm_90``, ``90``, ``gfx90a``): the local GPU, without asking torch."""
    return os.environ.get("KCACHE_GPU_ARCH") or None
