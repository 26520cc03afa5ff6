"""The payload of a ``jit`` entry: the files one JIT build produced, each with its size and sha256.

A ``jit`` entry carries native code a builder (Inductor's C++ backend, torch's cpp_extension, ...)
compiled and the consumer loads into its process. The entry travels opaque (the service never
reads it) and may be signed (:mod:`kcache_schemas.signed_envelope`); this container adds what an
unsigned entry lacks: every file's size and sha256, checked before a byte is written where the
builder looks, so a truncated or bit-flipped entry is refused, never installed.

Layout, version 1 (integers big-endian)::

    MAGIC "KCJIT1\\n" | u32 header length | header (JSON, ≤ MAX_HEADER_BYTES) | file bytes, in order

The header is ``{"adapter": str, "files": [{"name": str, "size": int, "sha256": hex}, ...]}``.
File names are labels the adapter gives (a role such as ``target``, or a file name inside the
builder's output dir): plain names, no directories. Adapters decide where each file goes.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

MAGIC: Final = b"KCJIT1\n"
MAX_HEADER_BYTES: Final = 64 * 1024
MAX_FILES: Final = 256
_LEN = struct.Struct(">I")
_NAME = re.compile(r"[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]{0,254}|\.[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]{0,253}")
_ADAPTER = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class JitArtifactError(ValueError):
    """Not a well-formed ``jit`` payload, or a file whose size or sha256 does not match."""


@dataclass(frozen=True)
class JitArtifact:
    adapter: str
    files: Mapping[str, bytes]


def encode(adapter: str, files: Mapping[str, bytes]) -> bytes:
    if not _ADAPTER.fullmatch(adapter):
        raise JitArtifactError(f"adapter {adapter[:80]!r} must be 1-64 chars of [a-z0-9-]")
    if not files or len(files) > MAX_FILES:
        raise JitArtifactError(f"a jit artifact holds 1 to {MAX_FILES} files, not {len(files)}")
    for name in files:
        if not _NAME.fullmatch(name):
            raise JitArtifactError(f"file name {name[:80]!r} is not a plain file name")
    header = json.dumps(
        {"adapter": adapter, "files": [{"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()]},
        separators=(",", ":"),
    ).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise JitArtifactError("jit artifact header too large")
    return b"".join([MAGIC, _LEN.pack(len(header)), header, *files.values()])


def decode(data: bytes) -> JitArtifact:
    """The files of a payload, each checked against its size and sha256; else JitArtifactError."""
    if not data.startswith(MAGIC):
        raise JitArtifactError("not a jit artifact (bad magic)")
    start = len(MAGIC) + _LEN.size
    if len(data) < start:
        raise JitArtifactError("jit artifact truncated")
    (size,) = _LEN.unpack_from(data, len(MAGIC))
    if size > MAX_HEADER_BYTES or len(data) < start + size:
        raise JitArtifactError("jit artifact header too large or truncated")
    try:
        header = json.loads(data[start : start + size])
        adapter, entries = header["adapter"], header["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise JitArtifactError(f"unreadable jit artifact header: {exc}") from None
    if not isinstance(adapter, str) or not _ADAPTER.fullmatch(adapter) or not isinstance(entries, list) or not 0 < len(entries) <= MAX_FILES:
        raise JitArtifactError("malformed jit artifact header")
    files: dict[str, bytes] = {}
    offset = start + size
    for entry in entries:
        name, length, digest = (entry.get(k) if isinstance(entry, dict) else None for k in ("name", "size", "sha256"))
        if not (isinstance(name, str) and _NAME.fullmatch(name) and name not in files):
            raise JitArtifactError("malformed or repeated file name in a jit artifact")
        if not (isinstance(length, int) and length >= 0 and isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise JitArtifactError(f"malformed size or sha256 for {name}")
        body = data[offset : offset + length]
        if len(body) != length or hashlib.sha256(body).hexdigest() != digest:
            raise JitArtifactError(f"{name}: size or sha256 does not match the header")
        files[name] = body
        offset += length
    if offset != len(data):
        raise JitArtifactError("trailing bytes after the files of a jit artifact")
    return JitArtifact(adapter, files)
