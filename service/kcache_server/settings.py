"""Service settings from ``KCACHE_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import ipaddress
import json
import os
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from kcache_schemas import validate_namespace
from kcache_schemas.signed_envelope import TrustedKeys, parse_public_key
from kcache_schemas.units import parse_duration
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    RootModel,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from kcache_server.retention_rules import ByteSize, Duration, RetentionConfig, parse_retention

# uvicorn's levels, in either case (the Helm chart's schema takes both).
LogLevel = Annotated[Literal["trace", "debug", "info", "warning", "error", "critical"],
                     BeforeValidator(lambda v: v.strip().lower() if isinstance(v, str) else v)]

ENV_PREFIX = "KCACHE_"
# The longest an S3 SigV4 presigned URL may be valid.
SIGV4_MAX_EXPIRES_S = 7 * 24 * 3600

Scope = Literal["read", "write", "admin"]
# Tokens anyone could guess are refused outright, like the full-stack template's "changethis".
_WEAK_TOKENS = {"changeme", "changethis", "secret", "password", "token", "kcache"}


def _whole_seconds(value: object) -> object:
    """A duration in the one grammar (``300``, ``5m``) as whole seconds (S3 presigns in seconds)."""
    if not isinstance(value, (str, int, float)):
        return value
    seconds = parse_duration(value)
    if seconds != int(seconds):
        raise ValueError(f"{value!r}: a whole number of seconds is needed (e.g. 300 or 5m)")
    return int(seconds)


def default_data_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kcache" / "server"


class TokenGrant(BaseModel):
    """One bearer token and what it may do: scopes in namespaces (``*`` = all)."""

    token: SecretStr
    name: str = "token"
    namespaces: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    scopes: list[Scope] = Field(min_length=1)

    @field_validator("token")
    @classmethod
    def _strong(cls, v: SecretStr) -> SecretStr:
        raw = v.get_secret_value()
        if len(raw) < 16 or raw.lower() in _WEAK_TOKENS:
            raise ValueError("tokens must be at least 16 characters and not a default secret")
        return v


class _RegisteredKeys(RootModel[dict[str, list[str]]]):
    """``KCACHE_PRODUCER_KEYS``: ``{"team-a": ["kcache-ed25519 <base64> [comment]", ...], "*": [...]}``."""

    @field_validator("root")
    @classmethod
    def _valid(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for ns, keys in v.items():
            if ns != "*":
                validate_namespace(ns)
            if not keys:
                raise ValueError(f"namespace {ns!r} lists no producer key")
            for k in keys:
                parse_public_key(k)  # ValueError names the problem
        return v


class Settings(BaseSettings):
    # Sizes and durations in kcache_schemas.units' grammar (64MiB, 15s); a bare number is bytes or
    # seconds, as the names say.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)  # 0: a free port, as the OS picks it
    workers: int = Field(default=1, ge=1)
    data_dir: Path = Field(default_factory=default_data_dir)
    blob_url: str | None = None
    index_url: str | None = None
    tokens_file: Path | None = None
    tokens: str | None = Field(default=None, description="JSON list of token grants")
    # Per namespace, the Ed25519 public keys whose signatures it requires on entry uploads
    # (kcache_server.producer_keys); a JSON object {namespace or "*": [public key, ...]}.
    producer_keys_file: Path | None = None
    producer_keys: str | None = Field(default=None, description="JSON object: namespace -> public keys")
    max_pack_bytes: ByteSize = 64 << 20
    # What a kernel pack may unpack to: the decompression cap. The largest real kernel dirs are a
    # few MB (a max-autotune GPT-2 has 200 of 0.7 MB on average), so 64 MiB leaves ample room.
    max_unpacked_bytes: ByteSize = 64 << 20
    max_entry_bytes: ByteSize = 256 << 20
    # Bytes one replica (worker process) lets heavy requests hold at once: bodies being received,
    # packs being verified or opened (kcache_server.memory_budget). Beyond it: 503 + Retry-After. 0: no
    # cap. 4 workers x (256 MiB + ~85 MiB idle) fit the Helm chart's default 2 GiB limit.
    memory_budget_bytes: ByteSize = 256 << 20
    # A request body must keep arriving (at most this long between parts) and be complete this
    # long after the request started; otherwise 408 (kcache_server.bodies).
    body_idle_timeout_s: Duration = 15.0
    body_timeout_s: Duration = 120.0
    backend_timeout_s: Duration = 5.0
    presigned_downloads: bool = False
    presign_expires_s: Annotated[int, BeforeValidator(_whole_seconds)] = Field(default=300, ge=1)
    # How long a replica hands out one signed URL of a blob again (kcache_server.store.presigned_urls):
    # it signs for presign_expires_s + this, so every URL handed out is valid presign_expires_s more.
    # Saves the signing CPU in a fleet start and lets a cache keyed by URL serve one URL to many
    # nodes. 0: a fresh signature each time.
    presign_reuse_s: Annotated[int, BeforeValidator(_whole_seconds)] = Field(default=60, ge=0)
    # How long a process serves a workload's view from memory (kcache_server.store.workload_manifests):
    # the ranks of a node and the nodes of a fleet start read the same view within moments. 0: never.
    workload_view_ttl_s: Duration = Field(default=1.0, ge=0)
    s3_endpoint_url: str | None = None
    access_flush_s: Duration = 2.0
    # How long /metrics reuses the storage usage it read from the index (kcache_server.metrics).
    metrics_usage_ttl_s: Duration = 10.0
    log_level: LogLevel = "info"
    # One INFO line per kernel pack or entry handed out, with its key (kcache_server.downloads):
    # per-key download counts, e.g. to prove the processes of a node fetch each artifact once.
    download_log: bool = False
    retention: str | None = Field(default=None, description="JSON retention rules (see kcache_server.retention_rules)")
    retention_file: Path | None = None

    @property
    def resolved_blob_url(self) -> str:
        return self.blob_url or f"file://{(self.data_dir / 'blobs').resolve()}"

    @property
    def resolved_index_url(self) -> str:
        return self.index_url or f"sqlite://{(self.data_dir / 'index.sqlite3').resolve()}"

    @model_validator(mode="after")
    def _presigned_urls_fit_s3(self) -> Settings:
        # SigV4 presigned URLs live at most a week; S3 refuses longer ones at GET time, on the node.
        if self.presign_expires_s + self.presign_reuse_s > SIGV4_MAX_EXPIRES_S:
            raise ValueError(
                f"KCACHE_PRESIGN_EXPIRES_S ({self.presign_expires_s}) + KCACHE_PRESIGN_REUSE_S ({self.presign_reuse_s}) "
                f"is longer than a presigned URL may live ({SIGV4_MAX_EXPIRES_S} s, a week)"
            )
        return self

    @model_validator(mode="after")
    def _parse_grants(self) -> Settings:
        # Parse tokens at load, so a weak or malformed token stops start-up, not the first request.
        _ = self.grants
        _ = self.registered_keys
        _ = self.retention_config  # the same for retention rules
        return self

    @cached_property
    def grants(self) -> list[TokenGrant]:
        grants: list[TokenGrant] = []
        for source, text in _sources("TOKENS", self.tokens_file, self.tokens):
            try:
                raw = json.loads(text)
                if not isinstance(raw, list):
                    raise ValueError("a JSON list of grants is expected: [{\"token\": ..., \"scopes\": [...]}]")
                for i, grant in enumerate(raw):
                    try:
                        grants.append(TokenGrant.model_validate(grant))
                    except ValidationError as exc:
                        raise ValueError(f"[{i}]{_first_error(exc)}") from None
            except ValueError as exc:  # json.JSONDecodeError too
                raise ValueError(f"{source}: {'not JSON: ' if isinstance(exc, json.JSONDecodeError) else ''}{exc}") from None
        return grants

    @cached_property
    def registered_keys(self) -> dict[str, TrustedKeys]:
        """Namespace (or ``*``: every namespace) -> the producer keys registered for it."""
        raw: dict[str, list[str]] = {}
        for source, text in _sources("PRODUCER_KEYS", self.producer_keys_file, self.producer_keys):
            try:
                for ns, keys in _RegisteredKeys.model_validate_json(text).root.items():
                    raw.setdefault(ns, []).extend(keys)
            except ValidationError as exc:
                raise ValueError(f"{source}: {_first_error(exc).lstrip('.: ')}") from None
        return {ns: TrustedKeys.of(parse_public_key(k) for k in keys) for ns, keys in raw.items()}

    @cached_property
    def retention_config(self) -> RetentionConfig:
        """``KCACHE_RETENTION_FILE`` (a JSON file) or ``KCACHE_RETENTION`` (inline JSON; wins)."""
        found = _sources("RETENTION", self.retention_file, self.retention)
        if not found:
            return RetentionConfig()
        source, text = found[-1]
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not JSON: {exc}") from None
        return parse_retention(raw, source)

    def check_bind(self) -> None:
        """Refuse to serve an open (tokenless) cache anywhere but loopback."""
        if self.grants:
            return
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        if not loopback:
            raise SystemExit(
                f"kcache: refusing to bind {self.host} without tokens: an open cache on the network "
                "lets anyone read and poison kernels. Configure KCACHE_TOKENS_FILE or KCACHE_TOKENS "
                "(see docs/deployment.md), or bind 127.0.0.1."
            )


def _sources(name: str, path: Path | None, inline: str | None) -> list[tuple[str, str]]:
    """``KCACHE_<name>_FILE``'s text, then ``KCACHE_<name>``'s, each with how to name it in an
    error; an unreadable file is a ValueError naming the variable."""
    out = []
    if path is not None:
        source = f"{ENV_PREFIX}{name}_FILE ({path})"
        try:
            out.append((source, path.read_text()))
        except OSError as exc:
            raise ValueError(f"{source}: {exc.strerror}") from None
    if inline:
        out.append((f"{ENV_PREFIX}{name}", inline))
    return out


def _first_error(exc: ValidationError) -> str:
    """``.where: what`` of a validation error's first problem (pydantic's prefix dropped)."""
    first = exc.errors()[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.get("loc", ()))
    return f"{where}: {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}"


def describe_errors(exc: ValidationError) -> str:
    """One line for ``kcache serve``: each problem with the variable it came from
    (``KCACHE_PORT='x': ...``); the checks across settings name theirs in the message."""
    out = []
    for e in exc.errors():
        loc = e.get("loc", ())
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if loc:
            var = ENV_PREFIX + str(loc[0]).upper()
            rest = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
            given = e.get("input")
            shown = f"={given[:40]!r}" if isinstance(given, str) and loc[0] not in _SECRET_FIELDS else ""
            if isinstance(given, str):  # kcache_schemas.units' messages start with the value
                msg = msg.removeprefix(f"{given[:40]!r}: ")
            out.append(f"{var}{shown}{rest}: {msg}")
        else:
            out.append(msg)
    return "; ".join(out)


_SECRET_FIELDS = ("tokens",)
