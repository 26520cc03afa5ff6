"""Client configuration from ``KCACHE_*`` environment variables (or ``kcache.install(...)``).

Every ``KCACHE_*`` variable the client reads is read here, with its default. The one exception is
``kcache._autoload``, which runs at every interpreter start and may import nothing but ``os`` and
``sys``: it reads its switches (``KCACHE_URL``, ``KCACHE_MODE``, ``KCACHE_AUTOLOAD``,
``KCACHE_TRITON_MANAGER``, ``KCACHE_WORKLOAD``) itself, with the same defaults and spellings
(tests/test_settings.py keeps the two in step).

Every value is parsed strictly (sccache's ``config.rs`` habit): a value that does not parse is
never replaced by a default, because the default may be more than was asked for
(``KCACHE_MODE=read-only`` must not mean read-write). :meth:`ClientConfig.from_env` raises
:class:`kcache.exceptions.ConfigError` naming each variable and what it accepts; ``kcache.install()``
lets it through; the paths that activate kcache by themselves (the ``.pth`` at interpreter start,
Triton's cache manager, the workload prefetcher) use :func:`settings_or_off`: one warning, and
kcache stays off in that process. An empty value is the same as an unset one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

Mode = Literal["readwrite", "readonly", "off"]
# The spellings KCACHE_MODE accepts (case-insensitive; "_" reads as "-"). kcache._autoload keeps
# its own copy (it may import nothing): tests/test_settings.py checks that they agree.
MODES: dict[str, Mode] = {
    "readwrite": "readwrite", "read-write": "readwrite", "rw": "readwrite",
    "readonly": "readonly", "read-only": "readonly", "ro": "readonly",
    "off": "off",
}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# Every layer KCACHE_LAYERS may name: Inductor's remote caches, Dynamo's precompile packages, JIT
# builders' modules and vLLM's compile cache (kcache.layers.inductor.remote_caches lists them; tests/test_settings.py
# keeps the two lists equal).
SELECTABLE_LAYERS = ("fx-graph", "autotune", "bundled-autotune", "aot-autograd", "dynamo-pgo", "dynamo", "jit", "vllm")
DEFAULT_LOCAL_MAX_BYTES = 10 << 30  # as sccache's default: a few max-autotune models fit
T = TypeVar("T")


def parse_mode(raw: str) -> Mode:
    mode = MODES.get(raw.strip().lower().replace("_", "-"))
    if mode is None:
        raise ValueError("not a mode: use readwrite (or read-write, rw), readonly (or read-only, ro), or off")
    return mode


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError("not a switch: use 1 or 0 (true/false, yes/no, on/off)")


def parse_require_hit(raw: str) -> Literal["warn", "fail"] | None:
    """``warn``/``fail``; a switch (``1``, ``on``: warn; ``0``, ``off``: off)."""
    value = raw.strip().lower()
    if value in ("warn", "fail"):
        return "warn" if value == "warn" else "fail"
    try:
        return "warn" if parse_bool(value) else None
    except ValueError:
        raise ValueError("use warn, fail, or off (0)") from None


def parse_layers(raw: str) -> str:
    """A comma list of layers, ``all`` or ``none``; returned as given (see :func:`selected_layers`)."""
    selected_layers(raw)
    return raw


def selected_layers(raw: str | None) -> list[str]:
    """The layers ``KCACHE_LAYERS`` names (a comma list, ``all`` or unset: every one, ``none``)."""
    text = (raw or "").strip().lower()
    if text in ("", "all"):
        return list(SELECTABLE_LAYERS)
    if text == "none":
        return []
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in SELECTABLE_LAYERS]
    if unknown or not names:
        raise ValueError(f"unknown layer {', '.join(map(repr, unknown)) or repr(raw)}: use all, none, or a comma list of {', '.join(SELECTABLE_LAYERS)}")
    return [n for n in SELECTABLE_LAYERS if n in names]


def parse_bytes(raw: str) -> int:
    """``1073741824``, ``512M``, ``10G``, ``10GB``, ``1.5GiB`` -> bytes: :mod:`kcache_schemas.units`."""
    from kcache_schemas.units import parse_bytes as parse

    return parse(raw)


def parse_fraction(raw: str) -> float:
    """``0.01``, ``1%``: a share from 0 to 1, :mod:`kcache_schemas.units`."""
    from kcache_schemas.units import parse_fraction as parse

    return parse(raw)


def _seconds(minimum: float = 0.0, *, above: bool = False) -> Callable[[str], float]:
    """A ``KCACHE_*_S`` value: seconds, or a duration with a unit (``500ms``, ``30s``, ``2m``)."""

    def parse(raw: str) -> float:
        from kcache_schemas.units import parse_duration

        value = parse_duration(raw)
        if value < minimum or (above and value == minimum):
            raise ValueError(f"must be {'above' if above else 'at least'} {minimum:g}s")
        return value

    return parse


def _count(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("not a whole number") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return parse


_GPU_ARCH_RE = re.compile(r"(?:sm_)?\d{2,3}|gfx[0-9a-z]+")


def parse_gpu_arch(raw: str) -> str:
    """``sm_90``, ``90``, ``gfx90a``: torch's names for a GPU (anything else would refuse every kernel)."""
    arch = raw.strip().lower()
    if _GPU_ARCH_RE.fullmatch(arch) is None:
        raise ValueError("not a GPU arch: use sm_90 (or 90) for NVIDIA, gfx90a for AMD")
    return arch


def _text(raw: str) -> str:
    return raw


def parse_url(raw: str) -> str:
    """A service URL: ``http(s)://host[:port][/prefix]``, the service's root (not its ``/v1``)."""
    from urllib.parse import urlsplit

    from kcache_schemas.wire import API  # enum only

    text = raw.strip()
    example = "http(s)://host[:port], e.g. http://127.0.0.1:8765"
    try:
        parts = urlsplit(text)
        _ = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc}): use {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a service URL: use {example}")
    if parts.path.rstrip("/").endswith(API):
        root = text.rstrip("/").removesuffix(API)
        raise ValueError(f"ends in {API}, the API's prefix: give the service's root ({root}); kcache adds {API}/... itself")
    return text


def _namespace(raw: str) -> str:
    from kcache_schemas.keys import validate_namespace  # re and base64 only

    try:
        return validate_namespace(raw)
    except ValueError as exc:  # InvalidKeyError: the rule, with the value
        raise ValueError(str(exc).replace(f"namespace {raw[:80]!r} ", "a namespace ", 1)) from None


# field -> (variable, parser). Fields not listed here have no variable. A keyword argument of
# install() given as a string goes through the same parser.
_VARIABLES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "url": ("KCACHE_URL", parse_url),
    "token": ("KCACHE_TOKEN", _text),
    "namespace": ("KCACHE_NAMESPACE", _namespace),
    "mode": ("KCACHE_MODE", parse_mode),
    "connect_timeout_s": ("KCACHE_CONNECT_TIMEOUT_S", _seconds(0.0, above=True)),
    "read_timeout_s": ("KCACHE_READ_TIMEOUT_S", _seconds(0.0, above=True)),
    "retries": ("KCACHE_RETRIES", _count(0)),
    "breaker_failures": ("KCACHE_BREAKER_FAILURES", _count(1)),
    "breaker_reset_s": ("KCACHE_BREAKER_RESET_S", _seconds()),
    "upload_queue": ("KCACHE_UPLOAD_QUEUE", _count(1)),
    "flush_timeout_s": ("KCACHE_FLUSH_TIMEOUT_S", _seconds()),
    "check_target": ("KCACHE_CHECK_TARGET", parse_bool),
    "gpu_arch": ("KCACHE_GPU_ARCH", parse_gpu_arch),
    "workload": ("KCACHE_WORKLOAD", _text),
    "stats_file": ("KCACHE_STATS_FILE", _text),
    "report": ("KCACHE_REPORT", parse_bool),
    "run_id": ("KCACHE_RUN_ID", _text),
    "signing_key": ("KCACHE_SIGNING_KEY", _text),
    "signing_private_key": ("KCACHE_SIGNING_PRIVATE_KEY", _text),
    "trusted_keys": ("KCACHE_TRUSTED_KEYS", _text),
    "layers": ("KCACHE_LAYERS", parse_layers),
    "prefetch_wait_s": ("KCACHE_PREFETCH_WAIT_S", _seconds()),
    "prefetch_timeout_s": ("KCACHE_PREFETCH_TIMEOUT_S", _seconds(0.0, above=True)),
    "coordesc_reuse": ("KCACHE_COORDESC_REUSE", parse_bool),
    "triton_manager": ("KCACHE_TRITON_MANAGER", parse_bool),
    "autoload": ("KCACHE_AUTOLOAD", parse_bool),
    "local_dir": ("KCACHE_LOCAL_DIR", _text),
    "local_max_bytes": ("KCACHE_LOCAL_MAX_BYTES", parse_bytes),
    "require_hit": ("KCACHE_REQUIRE_HIT", parse_require_hit),
    "canary": ("KCACHE_CANARY", parse_fraction),
}


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
    gpu_arch: str | None = None  # read by gpu_arch_override() (without a config); here to be checked
    workload: str | None = None
    stats_file: str | None = None
    report: bool = False
    run_id: str | None = None
    # Where run_id came from: KCACHE_RUN_ID, or the launcher variable it was derived from
    # (kcache.host.launchers); None: no run.
    run_source: str | None = None
    signing_key: str | None = field(default=None, repr=False)  # HMAC secret (see kcache.transport.entry_signing)
    signing_private_key: str | None = field(default=None, repr=False)  # Ed25519: a PEM file, or the key itself
    trusted_keys: str | None = None  # Ed25519 public keys accepted: files and/or keys, comma-separated
    layers: str | None = None  # KCACHE_LAYERS as given: a comma list, "all" or "none"
    prefetch_wait_s: float = 30.0
    # The read deadline of the workload prefetch's manifest request (never shorter than
    # read_timeout_s): it runs off the compile path, so a service slow to merge a workload's
    # manifest (a loaded one) delays the prefetch rather than failing it. A compile waits for that
    # manifest no longer than for an answer of its own (kcache.transport.workload.Prefetcher.wait_for).
    prefetch_timeout_s: float = 30.0
    coordesc_reuse: bool = True
    triton_manager: bool = True
    autoload: bool = True  # read by kcache._autoload at interpreter start; here to be checked
    local_dir: str | None = None
    local_max_bytes: int = DEFAULT_LOCAL_MAX_BYTES  # 0: unbounded
    require_hit: Literal["warn", "fail"] | None = None  # see kcache.layers.require_hit
    # The share of FX-graph and kernel hits this process compiles anyway and compares with the
    # entry (kcache.layers.key_canary): 0 (off) by default, so a hit costs nothing extra.
    canary: float = 0.0

    def local_root(self) -> Path:
        return Path(self.local_dir) if self.local_dir else default_local_dir()

    @property
    def enabled(self) -> bool:
        return bool(self.url) and self.mode != "off"

    @property
    def can_write(self) -> bool:
        return self.enabled and self.mode == "readwrite"

    @classmethod
    def from_env(cls, *, given_as: Callable[[str], str] | None = None, **overrides: Any) -> ClientConfig:
        """The settings of ``KCACHE_*`` variables, with ``overrides`` (``install()``'s keyword
        arguments; None: not given) on top. Raises :class:`kcache.exceptions.ConfigError` naming every
        value that does not parse (the variable, or the override as ``given_as`` spells it, e.g.
        the CLI's ``--namespace``), and what it accepts."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        for name, (var, parse) in _VARIABLES.items():
            given = overrides.get(name)
            if given is not None:
                raw, where = given, (given_as(name) if given_as else name) + "="
            else:
                raw, where = os.environ.get(var), f"{var}="
            if raw is None or (isinstance(raw, str) and not raw.strip()):
                continue  # unset, or set to nothing: the default
            shown = repr(raw[:40] if isinstance(raw, str) else raw)
            if not isinstance(raw, str):  # a typed keyword argument: the same parser, the same limits
                if (text := _typed_text(raw)) is None:
                    values[name] = raw  # another type (a Path): taken as given
                    continue
                raw = text
            try:
                values[name] = parse(raw)
            except ValueError as exc:  # the parsers of kcache_schemas.units start with the value
                problems.append(f"{where}{shown}: {str(exc).removeprefix(f'{raw[:40]!r}: ')}")
        if problems:
            from kcache.exceptions import (
                ConfigError,  # brings httpx and pydantic: only when refusing
            )

            raise ConfigError("invalid settings: " + "; ".join(problems))
        from kcache.host.launchers import EXPLICIT, derive_run_id

        if "run_id" in values:
            values["run_source"] = EXPLICIT
        elif derived := derive_run_id():  # a job that did not name itself: its launcher's id (CI, SLURM, torchrun, ...)
            values["run_id"], values["run_source"] = derived
        known = {f.name for f in fields(cls)}
        extra = {k: v for k, v in overrides.items() if v is not None and k not in _VARIABLES}
        if unknown := sorted(set(extra) - known):
            raise TypeError(f"kcache.install() got unknown options: {', '.join(unknown)}")
        return replace(cls(**values), **extra)


def _typed_text(value: object) -> str | None:
    """A bool or number given to ``install()`` as the text its setting's parser reads (so
    ``upload_queue=0`` is refused as ``KCACHE_UPLOAD_QUEUE=0`` is); None for other types."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)  # refused by every parser
        if value.is_integer():
            return str(int(value))  # 30.0 seconds, 1e9 bytes
        return repr(value) if "e" not in repr(value) else format(value, ".17f").rstrip("0")  # 1e-05: 0.00001
    return None


def settings_or_off(**overrides: Any) -> ClientConfig | None:
    """:meth:`ClientConfig.from_env` for the paths that activate kcache by themselves (the
    ``.pth``, Triton's cache manager, the prefetcher): a value that does not parse is one warning
    per process, and None (kcache stays off) instead of an exception in someone else's job."""
    try:
        return ClientConfig.from_env(**overrides)
    except ValueError as exc:
        from kcache.host.failopen import warn_once

        warn_once(f"{exc}; kcache is off in this process")
        return None


def default_local_dir() -> Path:
    """kcache's local tier: ``$KCACHE_LOCAL_DIR``, else ``$XDG_CACHE_HOME/kcache/client``, else
    ``~/.cache/kcache/client``."""
    if d := os.environ.get("KCACHE_LOCAL_DIR"):
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kcache" / "client"


def gpu_arch_override() -> str | None:
    """``KCACHE_GPU_ARCH`` (``sm_90``, ``90``, ``gfx90a``): the local GPU, without asking torch.
    A value that does not parse is None here: the settings refused it already (install() raised,
    or kcache is off in this process)."""
    try:
        return parse_gpu_arch(raw) if (raw := os.environ.get("KCACHE_GPU_ARCH", "")).strip() else None
    except ValueError:
        return None
