"""The payload of a ``vllm`` entry: one directory tree, compressed, every file verified.

vLLM's compile cache keeps a compiled model as a tree (``rank_0_0/model`` and the Inductor cache
vLLM points Inductor at: hundreds of files in nested dirs). kcache stores the tree as one entry,
so a node installs all of it or none of it. The entry travels opaque (the service never reads
it) and may be signed (:mod:`kcache_schemas.signed_envelope`); this container adds what an unsigned
entry lacks: every file's size and sha256, checked before a byte is written, and path rules that
keep every file inside the dir it is installed into.

Layout, version 1 (integers big-endian)::

    MAGIC "KCTREE1\\n" | one zstd frame that declares its content size, of:
        u32 header length | header (JSON, ≤ MAX_HEADER_BYTES) | file bytes, in header order

The header is ``{"kind": str, "files": [{"path": str, "size": int, "sha256": hex, "exec": bool}]}``.
A path is relative, ``/``-separated, of plain segments (no ``.``, ``..``, empty or absolute
parts), at most ``MAX_DEPTH`` deep; no path is repeated or is a directory of another. Caps make a
hostile entry cheap to refuse: the frame's declared size is checked before it is decompressed.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import zstandard

MAGIC: Final = b"KCTREE1\n"
MAX_HEADER_BYTES: Final = 8 << 20
MAX_FILES: Final = 50_000
MAX_DEPTH: Final = 16
MAX_PATH_CHARS: Final = 1024
MAX_UNPACKED_BYTES: Final = 2 << 30  # the client holds a tree in memory while it installs it
_LEN = struct.Struct(">I")
_SEGMENT = re.compile(r"[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]{0,254}|\.[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]{0,253}")
_KIND = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class TreeError(ValueError):
    """Not a well-formed tree payload, or a file whose size or sha256 does not match."""


@dataclass(frozen=True)
class TreeFile:
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class Tree:
    kind: str
    files: Mapping[str, TreeFile]  # relative path -> file, in stored order


def check_path(path: str) -> str:
    """``path`` if it is a relative path of plain segments within the caps, else TreeError."""
    parts = path.split("/")
    if not path or len(path) > MAX_PATH_CHARS or len(parts) > MAX_DEPTH or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise TreeError(f"path {path[:120]!r} is not a relative path of plain names")
    return path


def _check_layout(paths: list[str]) -> None:
    seen = set(paths)
    if len(seen) != len(paths):
        raise TreeError("a path is repeated in a tree")
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise TreeError(f"{'/'.join(parts[:i])!r} is both a file and a directory")


def encode(kind: str, files: Mapping[str, TreeFile], level: int = 3) -> bytes:
    if not _KIND.fullmatch(kind):
        raise TreeError(f"kind {kind[:80]!r} must be 1-64 chars of [a-z0-9-]")
    if not files or len(files) > MAX_FILES:
        raise TreeError(f"a tree holds 1 to {MAX_FILES} files, not {len(files)}")
    paths = [check_path(p) for p in files]
    _check_layout(paths)
    header = json.dumps(
        {"kind": kind, "files": [{"path": p, "size": len(f.data), "sha256": hashlib.sha256(f.data).hexdigest(), "exec": f.executable}
                                 for p, f in files.items()]},
        separators=(",", ":"),
    ).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise TreeError("tree header too large")
    body = b"".join([_LEN.pack(len(header)), header, *(f.data for f in files.values())])
    if len(body) > MAX_UNPACKED_BYTES:
        raise TreeError(f"a tree unpacks to at most {MAX_UNPACKED_BYTES} bytes")
    return MAGIC + zstandard.ZstdCompressor(level=level, write_content_size=True).compress(body)


def decode(data: bytes, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> Tree:
    """The files of a payload, each checked against its size and sha256; else TreeError."""
    if not data.startswith(MAGIC):
        raise TreeError("not a tree (bad magic)")
    frame = data[len(MAGIC):]
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise TreeError(f"tree is truncated or corrupt: unreadable zstd frame header ({exc})") from None
    if size < 0:
        raise TreeError("tree's zstd frame does not declare its content size")
    if size > max_unpacked_bytes:
        raise TreeError(f"tree unpacks to more than the allowed size ({size} > {max_unpacked_bytes} bytes)")
    stream = zstandard.ZstdDecompressor().decompressobj()
    try:
        body = stream.decompress(frame)
    except zstandard.ZstdError as exc:
        raise TreeError(f"tree is truncated or corrupt (zstd: {exc})") from None
    if not stream.eof or len(body) != size:
        raise TreeError("tree is truncated: its zstd frame ends early")
    if stream.unused_data:
        raise TreeError(f"tree has {len(stream.unused_data)} bytes after its zstd frame")
    return _parse(body)


def _parse(body: bytes) -> Tree:
    if len(body) < _LEN.size:
        raise TreeError("tree truncated")
    (size,) = _LEN.unpack_from(body, 0)
    start = _LEN.size
    if size > MAX_HEADER_BYTES or len(body) < start + size:
        raise TreeError("tree header too large or truncated")
    try:
        header = json.loads(body[start : start + size])
        kind, entries = header["kind"], header["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TreeError(f"unreadable tree header: {exc}") from None
    if not isinstance(kind, str) or not _KIND.fullmatch(kind) or not isinstance(entries, list) or not 0 < len(entries) <= MAX_FILES:
        raise TreeError("malformed tree header")
    files: dict[str, TreeFile] = {}
    offset = start + size
    for entry in entries:
        path, length, digest, executable = (entry.get(k) if isinstance(entry, dict) else None for k in ("path", "size", "sha256", "exec"))
        if not isinstance(path, str):
            raise TreeError("malformed path in a tree")
        check_path(path)
        if not (isinstance(length, int) and length >= 0 and isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise TreeError(f"malformed size or sha256 for {path[:120]}")
        if not isinstance(executable, bool):
            raise TreeError(f"malformed exec flag for {path[:120]}")
        content = body[offset : offset + length]
        if len(content) != length or hashlib.sha256(content).hexdigest() != digest:
            raise TreeError(f"{path[:120]}: size or sha256 does not match the header")
        if path in files:
            raise TreeError("a path is repeated in a tree")
        files[path] = TreeFile(content, executable)
        offset += length
    if offset != len(body):
        raise TreeError("trailing bytes after the files of a tree")
    _check_layout(list(files))
    return Tree(kind, files)
