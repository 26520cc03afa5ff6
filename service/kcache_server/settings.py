"""Service settings from ``KCACHE_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import ipaddress
import json
import os
from functools import cached_property
from pathlib import Path
from typing import Literal

from kcache_schemas import validate_namespace
from kcache_schemas.signature import TrustedKeys, parse_public_key
from pydantic import BaseModel, Field, RootModel, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kcache_server.retention import RetentionConfig, parse_retention

Scope = Literal["read", "write", "admin"]
# Tokens anyone could guess are refused outright, like the full-stack template's "changethis".
_WEAK_TOKENS = {"changeme", "changethis", "secret", "password", "token", "kcache"}


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
    model_config = SettingsConfigDict(env_prefix="KCACHE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8765
    workers: int = 1
    data_dir: Path = Field(default_factory=default_data_dir)
    blob_url: str | None = None
    index_url: str | None = None
    tokens_file: Path | None = None
    tokens: str | None = Field(default=None, description="JSON list of token grants")
    # Per namespace, the Ed25519 public keys whose signatures it requires on entry uploads
    # (kcache_server.signatures); a JSON object {namespace or "*": [public key, ...]}.
    producer_keys_file: Path | None = None
    producer_keys: str | None = Field(default=None, description="JSON object: namespace -> public keys")
    max_pack_bytes: int = 64 << 20
    # What a kernel pack may unpack to: the decompression cap. The largest real kernel dirs are a
    # few MB (a max-autotune GPT-2 has 200 of 0.7 MB on average), so 64 MiB leaves ample room.
    max_unpacked_bytes: int = 64 << 20
    max_entry_bytes: int = 256 << 20
    # Bytes one replica (worker process) lets heavy requests hold at once: bodies being received,
    # packs being verified or opened (kcache_server.budget). Beyond it: 503 + Retry-After. 0: no
    # cap. 4 workers x (256 MiB + ~85 MiB idle) fit the Helm chart's default 2 GiB limit.
    memory_budget_bytes: int = 256 << 20
    # A request body must keep arriving (at most this long between parts) and be complete this
    # long after the request started; otherwise 408 (kcache_server.bodies).
    body_idle_timeout_s: float = 15.0
    body_timeout_s: float = 120.0
    backend_timeout_s: float = 5.0
    presigned_downloads: bool = False
    presign_expires_s: int = 300
    s3_endpoint_url: str | None = None
    access_flush_s: float = 2.0
    log_level: str = "info"
    retention: str | None = Field(default=None, description="JSON retention rules (see kcache_server.retention)")
    retention_file: Path | None = None

    @property
    def resolved_blob_url(self) -> str:
        return self.blob_url or f"file://{(self.data_dir / 'blobs').resolve()}"

    @property
    def resolved_index_url(self) -> str:
        return self.index_url or f"sqlite://{(self.data_dir / 'index.sqlite3').resolve()}"

    @model_validator(mode="after")
    def _parse_grants(self) -> Settings:
        # Parse tokens at load, so a weak or malformed token stops start-up, not the first request.
        _ = self.grants
        _ = self.registered_keys
        _ = self.retention_config  # the same for retention rules
        return self

    @cached_property
    def grants(self) -> list[TokenGrant]:
        raw: list[object] = []
        if self.tokens_file is not None:
            raw += json.loads(self.tokens_file.read_text())
        if self.tokens:
            raw += json.loads(self.tokens)
        return [TokenGrant.model_validate(g) for g in raw]

    @cached_property
    def registered_keys(self) -> dict[str, TrustedKeys]:
        """Namespace (or ``*``: every namespace) -> the producer keys registered for it."""
        raw: dict[str, list[str]] = {}
        for source in (self.producer_keys_file.read_text() if self.producer_keys_file else None, self.producer_keys):
            if source:
                for ns, keys in _RegisteredKeys.model_validate_json(source).root.items():
                    raw.setdefault(ns, []).extend(keys)
        return {ns: TrustedKeys.of(parse_public_key(k) for k in keys) for ns, keys in raw.items()}

    @cached_property
    def retention_config(self) -> RetentionConfig:
        """``KCACHE_RETENTION_FILE`` (a JSON file) or ``KCACHE_RETENTION`` (inline JSON; wins)."""
        if self.retention:
            source, text = "KCACHE_RETENTION", self.retention
        elif self.retention_file is not None:
            source = f"KCACHE_RETENTION_FILE ({self.retention_file})"
            try:
                text = self.retention_file.read_text()
            except OSError as exc:
                raise ValueError(f"{source}: {exc.strerror}") from None
        else:
            return RetentionConfig()
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
