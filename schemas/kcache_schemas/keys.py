"""Validation and normalisation of every identifier that reaches a URL or a storage key.

Everything that can become part of a path on disk or in S3 passes through here first, so the
storage layer can build paths from these values without further checks.
"""

from __future__ import annotations

import base64
import re

# Triton names a kernel dir by base32(sha256(cache key)) without padding: 52 chars of [A-Z2-7].
_KERNEL_KEY_RE = re.compile(r"^[A-Z2-7]{52}$")
_HEX_KEY_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_NAMESPACE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_LAYER_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
# Inductor's remote-cache keys look like "pt2:fx-graph-v1::f3k...:c1"; keep them URL-safe and
# bounded, and never let them contain a path separator.
_ENTRY_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:=+-]{0,511}$")
_WORKLOAD_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# A run id (e.g. a CI job id) may carry ':' and '+' (``gh:1234+retry``), never a path separator.
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,127}$")

# Every rule below matches the whole string (``fullmatch``: ``$`` alone lets a trailing newline
# through). The same rules as ECMA-262 patterns, for documents (OpenAPI path parameters); the
# kernel key's last character is 'A' or 'Q' (see normalize_kernel_key).
KERNEL_KEY_PATTERN = r"^(?:[A-Z2-7]{51}[AQ]|[0-9a-fA-F]{64})$"
NAMESPACE_PATTERN = _NAMESPACE_RE.pattern
LAYER_PATTERN = _LAYER_RE.pattern
ENTRY_KEY_PATTERN = _ENTRY_KEY_RE.pattern
WORKLOAD_NAME_PATTERN = _WORKLOAD_RE.pattern
RUN_ID_PATTERN = _RUN_ID_RE.pattern


class InvalidKeyError(ValueError):
    """An identifier (kernel key, namespace, layer, entry key, workload name, run id) is malformed."""


def hex_to_kernel_key(hex_hash: str) -> str:
    """Triton's ``_base32``: the dir name Triton derives from a 64-hex sha256."""
    return base64.b32encode(bytes.fromhex(hex_hash)).decode("ascii").rstrip("=")


def normalize_kernel_key(raw: str) -> str:
    """Return the canonical 52-char base32 key for a Triton cache-dir name or its 64-hex hash."""
    if _KERNEL_KEY_RE.fullmatch(raw):
        # base32 of 32 bytes leaves 4 unused low bits in the last char: reject non-canonical
        # spellings so one kernel never has two keys. Those bits are zero only for 'A' (0) and
        # 'Q' (16), which is what a decode/encode round trip checks, ~50x cheaper (a
        # find-missing of 10,000 keys spent most of its time here).
        if raw[-1] not in "AQ":
            raise InvalidKeyError(f"kernel key {raw!r} is not a canonical base32 sha256")
        return raw
    if _HEX_KEY_RE.fullmatch(raw):
        return hex_to_kernel_key(raw.lower())
    raise InvalidKeyError(
        f"kernel key {raw[:80]!r} is neither a 52-char Triton cache-dir name ([A-Z2-7]) "
        "nor a 64-char hex sha256"
    )


def validate_namespace(raw: str) -> str:
    if not _NAMESPACE_RE.fullmatch(raw):
        raise InvalidKeyError(
            f"namespace {raw[:80]!r} must be 1-63 chars of [a-z0-9._-] starting with a letter or digit"
        )
    return raw


def validate_layer(raw: str) -> str:
    if not _LAYER_RE.fullmatch(raw):
        raise InvalidKeyError(f"layer {raw[:80]!r} must be 1-32 chars of [a-z0-9-]")
    return raw


def normalize_entry_key(raw: str) -> str:
    if not _ENTRY_KEY_RE.fullmatch(raw):
        raise InvalidKeyError(
            f"entry key {raw[:80]!r} must be 1-512 chars of [A-Za-z0-9_.:=+-] "
            "and must not start with a punctuation character"
        )
    return raw


def validate_workload_name(raw: str) -> str:
    if not _WORKLOAD_RE.fullmatch(raw):
        raise InvalidKeyError(f"workload name {raw[:80]!r} must be 1-128 chars of [A-Za-z0-9_.-]")
    return raw


def validate_run_id(raw: str) -> str:
    if not _RUN_ID_RE.fullmatch(raw):
        raise InvalidKeyError(f"run id {raw[:80]!r} must be 1-128 chars of [A-Za-z0-9_.:+-]")
    return raw
