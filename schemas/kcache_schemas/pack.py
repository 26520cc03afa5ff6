"""The kernel pack: one Triton kernel dir as a single zstd-compressed, streamable file.

Format, version 1 (media type ``application/vnd.kcache.pack.v1``, file suffix ``.kpack``)::

    zstd( tar(PAX) [ kcache-pack.json, <file 1>, <file 2>, ... ] )

* The first tar member is ``kcache-pack.json``, a :class:`KernelManifest` (key, kernel name,
  target, triton version, and ``name``/``size``/``sha256`` of every file).
* Then every file of the kernel dir, in manifest order, as plain regular members. No dirs,
  links, devices or other member types; no member that the manifest does not name.
* ``.json`` payloads are stored exactly as ``TritonBundler.collect`` produces them: the kernel
  dir's absolute path replaced by ``[REPLACE]``. Nothing in a pack is machine-local.
* Members are written with mtime 0, uid/gid 0 and mode 0644, so the same files give the same bytes.

A reader can verify and write each file as it streams (manifest first), and standard tools can
inspect a pack: ``zstd -dc X.kpack | tar tv``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import zstandard
from pydantic import ValidationError

from kcache_schemas.errors import ErrorCode, PackError
from kcache_schemas.keys import InvalidKeyError, hex_to_kernel_key, normalize_kernel_key
from kcache_schemas.models import (
    GROUP_PREFIX,
    REPLACE_SENTINEL,
    KernelManifest,
    KernelTarget,
    PackFile,
    Producer,
)

MANIFEST_NAME = "kcache-pack.json"
MEDIA_TYPE = "application/vnd.kcache.pack.v1"
_REPLACE = REPLACE_SENTINEL.encode()
# tar headers, padding and the end-of-archive blocks: generous per-member allowance on top of
# the payload bytes when capping decompression.
_TAR_OVERHEAD_PER_MEMBER = 3 * 512


@dataclass(frozen=True)
class PackLimits:
    """Caps that make a hostile pack cheap to refuse (bombs, huge manifests, file floods)."""

    max_unpacked_bytes: int = 1 << 30
    max_manifest_bytes: int = 1 << 20
    max_files: int = 64


DEFAULT_LIMITS = PackLimits()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _target_from_metadata(meta: Mapping[str, object]) -> KernelTarget:
    target = meta.get("target")
    if not isinstance(target, dict):
        raise PackError("kernel metadata has no 'target' object")
    backend, arch, warp_size = target.get("backend"), target.get("arch"), target.get("warp_size")
    try:
        return KernelTarget(
            device_type=backend,  # type: ignore[arg-type]
            arch=str(arch) if isinstance(arch, (int, str)) else json.dumps(arch, sort_keys=True),
            warp_size=warp_size,  # type: ignore[arg-type]
        )
    except ValidationError as exc:
        raise PackError(f"kernel metadata 'target' is not usable: {target!r}") from exc


def check_kernel_files(manifest: KernelManifest, files: Mapping[str, bytes]) -> None:
    """Check that files and manifest agree and form a path-free Triton kernel dir.

    Raises :class:`PackError` naming the first problem. Run by the service before it stores a
    pack and by the client before it emits one, so both trust nothing they are sent.
    """
    if set(files) != {f.name for f in manifest.files}:
        raise PackError("files do not match the manifest's file list")
    parsed: dict[str, object] = {}  # each .json parsed once
    for f in manifest.files:
        data = files[f.name]
        if len(data) != f.size:
            raise PackError(f"{f.name}: size {len(data)} does not match manifest size {f.size}")
        if _sha256(data) != f.sha256:
            raise PackError(f"{f.name}: sha256 does not match the manifest")
        if f.name.endswith(".json"):
            try:
                parsed[f.name] = json.loads(data)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise PackError(f"{f.name}: not valid JSON ({exc})") from exc
        elif _REPLACE in data:
            raise PackError(f"{f.name}: the {REPLACE_SENTINEL} sentinel may appear only in .json files")

    def _json(name: str) -> object:
        return parsed[name] if name in parsed else json.loads(files[name])

    meta = _json(manifest.metadata_file)
    if not isinstance(meta, dict):
        raise PackError(f"{manifest.metadata_file}: not a JSON object")
    hex_hash = meta.get("hash")
    if not isinstance(hex_hash, str) or len(hex_hash) != 64:
        raise PackError(f"{manifest.metadata_file}: no 64-hex 'hash' field")
    try:
        derived_key = hex_to_kernel_key(hex_hash)
    except ValueError as exc:
        raise PackError(f"{manifest.metadata_file}: 'hash' is not hex") from exc
    if derived_key != manifest.key:
        raise PackError(
            f"pack is for kernel {derived_key} (from {manifest.metadata_file}), not {manifest.key}",
            ErrorCode.KEY_MISMATCH,
        )
    if meta.get("name") != manifest.kernel_name:
        raise PackError(f"{manifest.metadata_file}: 'name' is not {manifest.kernel_name!r}")
    if _target_from_metadata(meta) != manifest.target:
        raise PackError("manifest target does not match the kernel metadata's target")

    group = _json(manifest.group_file)
    children = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(children, dict):
        raise PackError(f"{manifest.group_file}: no 'child_paths' object")
    expected = {f.name for f in manifest.files} - {manifest.group_file}
    if set(children) != expected:
        raise PackError(f"{manifest.group_file}: children {sorted(children)} != files {sorted(expected)}")
    for child, path in children.items():
        if path != f"{REPLACE_SENTINEL}/{child}":
            raise PackError(
                f"{manifest.group_file}: child {child!r} points to {str(path)[:120]!r}, "
                f"expected '{REPLACE_SENTINEL}/{child}' (path-free form)"
            )


def manifest_for_files(
    key: str, files: Mapping[str, bytes], producer: Producer | None = None
) -> KernelManifest:
    """Build and check the manifest for a kernel dir's files already in ``[REPLACE]`` form."""
    try:
        key = normalize_kernel_key(key)
    except InvalidKeyError as exc:
        raise PackError(str(exc), ErrorCode.INVALID_KEY) from exc
    groups = [n for n in files if n.startswith(GROUP_PREFIX)]
    if len(groups) != 1:
        raise PackError(f"a kernel dir has exactly one {GROUP_PREFIX}<name>.json file, found {groups}")
    kernel_name = groups[0][len(GROUP_PREFIX) : -len(".json")]
    meta_name = f"{kernel_name}.json"
    if meta_name not in files:
        raise PackError(f"kernel dir lacks its metadata file {meta_name!r}")
    try:
        meta = json.loads(files[meta_name])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackError(f"{meta_name}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise PackError(f"{meta_name}: not a JSON object")
    try:
        manifest = KernelManifest(
            key=key,
            kernel_name=kernel_name,
            target=_target_from_metadata(meta),
            triton_version=str(meta.get("triton_version") or "unknown"),
            files=[
                PackFile(name=n, size=len(d), sha256=_sha256(d)) for n, d in sorted(files.items())
            ],
            producer=producer or Producer(),
        )
    except ValidationError as exc:
        raise PackError(f"kernel dir does not form a valid manifest: {_first_error(exc)}") from exc
    check_kernel_files(manifest, files)
    return manifest


def build_pack(manifest: KernelManifest, files: Mapping[str, bytes], level: int = 3) -> bytes:
    """Serialise a checked manifest and its files into pack bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        _add_member(tf, MANIFEST_NAME, manifest.model_dump_json().encode())
        for f in manifest.files:
            _add_member(tf, f.name, files[f.name])
    return zstandard.ZstdCompressor(level=level).compress(raw.getvalue())


def _add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tf.addfile(info, io.BytesIO(data))


# tarfile parses PAX records and reads GNU long names before a member reaches our checks, and
# CPython < 3.11.10 / 3.12.6 parses PAX records in super-linear time (CVE-2024-6232): a few hundred
# KB of digits in one header pins a CPU for minutes. build_pack writes at most one short "path"
# record per member, so bigger extended headers are refused before tarfile parses them.
_MAX_EXTENDED_HEADER = 1024
_EXTENDED_TYPES = (
    tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK,
)


class _GuardedTarInfo(tarfile.TarInfo):
    def _proc_member(self, tarfile):  # type: ignore[no-untyped-def]
        if self.type in _EXTENDED_TYPES and self.size > _MAX_EXTENDED_HEADER:
            raise PackError(
                f"pack has a {self.size}-byte extended tar header (limit {_MAX_EXTENDED_HEADER})"
            )
        return super()._proc_member(tarfile)  # type: ignore[misc]


class _CappedReader(io.RawIOBase):
    """Reads a decompressing stream but refuses to yield more than ``cap`` bytes (bomb guard)."""

    def __init__(self, inner: IO[bytes], cap: int) -> None:
        self._inner, self._left = inner, cap

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        want = len(buf)
        data = self._inner.read(min(want, self._left + 1))
        if len(data) > self._left:
            raise PackError("pack decompresses to more than the allowed size", ErrorCode.TOO_LARGE)
        self._left -= len(data)
        buf[: len(data)] = data
        return len(data)


def read_pack(
    data: bytes, limits: PackLimits = DEFAULT_LIMITS
) -> tuple[KernelManifest, dict[str, bytes]]:
    """Parse and fully verify pack bytes; every problem is a :class:`PackError`."""
    cap = limits.max_unpacked_bytes + limits.max_manifest_bytes
    cap += _TAR_OVERHEAD_PER_MEMBER * (limits.max_files + 2)
    members = _plain_tar_members(data, min(cap, _FAST_PATH_BYTES))
    if members is not None:
        # Fast path for the common case: one zstd frame of a small plain tar (what build_pack
        # writes), decompressed and walked in memory. Same checks, same errors: _read_members
        # does all the judging, exactly as on the streaming path.
        manifest, files = _read_members(iter(members), _MemberBytes.read, limits)
    else:
        stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
        reader = io.BufferedReader(_CappedReader(stream, cap), buffer_size=1 << 16)
        try:
            with tarfile.open(fileobj=reader, mode="r|", tarinfo=_GuardedTarInfo) as tf:
                manifest, files = _read_members(iter(tf), functools.partial(_read_member, tf), limits)
        except PackError:
            raise
        except (tarfile.TarError, zstandard.ZstdError, EOFError, OSError, IndexError) as exc:
            raise PackError(f"pack is truncated or not a zstd-compressed tar: {exc}") from exc
    check_kernel_files(manifest, files)
    return manifest, files


# Packs whose tar is at most this big are decompressed in one call and walked in memory; larger
# ones (and anything unusual) stream through tarfile under the bomb guard.
_FAST_PATH_BYTES = 32 << 20
_ZERO_BLOCK = bytes(512)


@dataclass(frozen=True)
class _MemberBytes:
    """A plain regular tar member found by :func:`_plain_tar_members` (quacks like TarInfo)."""

    name: str
    size: int
    data: bytes

    def isreg(self) -> bool:
        return True

    def issym(self) -> bool:
        return False

    def islnk(self) -> bool:
        return False

    def read(self) -> bytes:
        return self.data


# The numeric fields of a header as tarfile writes them for a regular file (octal digits,
# NUL-terminated: mode, uid, gid, size, mtime, checksum "%06o\0 "), typeflag..gname skipped,
# then devmajor/devminor (octal or all-NUL) and an empty ustar prefix. Matched from offset 100.
_PLAIN_HEADER = re.compile(
    rb"[0-7]{7}\0[0-7]{7}\0[0-7]{7}\0([0-7]{11})\0[0-7]{11}\0([0-7]{6})\0 .{173}"
    rb"(?:[0-7]{7}\0|\0{8}){2}\0",
    re.DOTALL,
)


def _plain_tar_members(data: bytes, budget: int) -> list[_MemberBytes] | None:
    """The members of a pack that is one zstd frame of at most ``budget`` bytes holding a plain
    tar (headers as tarfile writes them for regular files, valid checksums, no PAX/GNU
    extensions, no ustar prefix), in order. None for anything else: the caller then takes the
    streaming tarfile path, which judges (and words its errors about) every unusual or hostile
    input, so this shortcut never changes what is accepted or how a refusal reads.
    """
    try:
        declared = zstandard.frame_content_size(data)
        if declared > budget:
            return None
        dctx = zstandard.ZstdDecompressor()
        if declared < 0:  # not declared: cap the output
            raw = dctx.decompress(data, max_output_size=budget, allow_extra_data=False)
        else:  # declared, and zstd checks it against the real output
            raw = dctx.decompress(data, allow_extra_data=False)
    except zstandard.ZstdError:
        return None
    if not raw:
        return None  # tarfile calls that an "empty file"
    members: list[_MemberBytes] = []
    off, end = 0, len(raw)
    while off < end:  # ending exactly at a header boundary is tarfile's end of archive too
        hdr = raw[off : off + 512]
        if hdr == _ZERO_BLOCK:
            break  # end-of-archive block: tarfile stops here and ignores the rest
        m = _PLAIN_HEADER.match(hdr, 100) if len(hdr) == 512 else None
        if m is None or hdr[156:157] not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            return None
        if int(m[2], 8) != 256 + sum(hdr[:148]) + sum(hdr[156:]):
            return None
        size = int(m[1], 8)
        name = hdr[:100].split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")
        start = off + 512
        off = start + -(-size // 512) * 512
        if name.endswith("/") or off > end:
            return None
        members.append(_MemberBytes(name, size, raw[start : start + size]))
    return members


def _read_members(
    members: Iterator[Any], read: Callable[[Any], bytes], limits: PackLimits
) -> tuple[KernelManifest, dict[str, bytes]]:
    first = next(members, None)
    if first is None or first.name != MANIFEST_NAME or not first.isreg():
        raise PackError(f"the first pack member must be the regular file {MANIFEST_NAME}")
    if first.size > limits.max_manifest_bytes:
        raise PackError("pack manifest is too large", ErrorCode.TOO_LARGE)
    try:
        manifest = KernelManifest.model_validate_json(read(first))
    except ValidationError as exc:
        raise PackError(f"invalid pack manifest: {_first_error(exc)}") from exc
    if len(manifest.files) > limits.max_files:
        raise PackError(f"pack has {len(manifest.files)} files, limit {limits.max_files}")
    if manifest.total_size > limits.max_unpacked_bytes:
        raise PackError(
            f"pack unpacks to {manifest.total_size} bytes, limit {limits.max_unpacked_bytes}",
            ErrorCode.TOO_LARGE,
        )
    files: dict[str, bytes] = {}
    for expected in manifest.files:
        member = next(members, None)
        if member is None:
            raise PackError(f"pack is truncated: {expected.name} is missing")
        if not member.isreg():
            kind = "symlink" if member.issym() else "hard link" if member.islnk() else "non-regular"
            raise PackError(f"pack member {member.name!r} is a {kind} entry; only files are allowed")
        if member.name != expected.name:
            raise PackError(f"pack member {member.name[:120]!r} is not {expected.name!r} (manifest order)")
        if member.size != expected.size:
            raise PackError(f"{member.name}: tar size {member.size} != manifest size {expected.size}")
        files[member.name] = read(member)
    extra = next(members, None)
    if extra is not None:
        raise PackError(f"pack member {extra.name[:120]!r} is not named by the manifest")
    return manifest, files


def _read_member(tf: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:  # streaming path
    fh = tf.extractfile(member)
    if fh is None:
        raise PackError(f"pack member {member.name!r} has no data")
    data = fh.read()
    if len(data) != member.size:
        raise PackError(f"pack is truncated inside {member.name!r}")
    return data


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))


def read_kernel_dir(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """Read a local Triton kernel dir into ``[REPLACE]`` form, as ``TritonBundler.collect`` does.

    The absolute dir prefix is taken from the group file's child paths (what Triton actually
    wrote), so a dir reached through a different spelling of its path still packs path-free.
    """
    root = Path(path)
    files: dict[str, bytes] = {}
    for entry in sorted(root.iterdir()):
        # Triton's own temp dirs and lock files are not part of a kernel.
        if entry.name.startswith("tmp.") or entry.name == "lock" or not entry.is_file():
            continue
        if entry.is_symlink():
            raise PackError(f"{entry.name}: symlinks are not packed")
        files[entry.name] = entry.read_bytes()
    prefixes = {str(root).encode(), os.path.abspath(root).encode()}
    for name, data in files.items():
        if name.startswith(GROUP_PREFIX) and name.endswith(".json"):
            try:
                group = json.loads(data)
                for child, child_path in group.get("child_paths", {}).items():
                    if isinstance(child_path, str) and child_path.endswith("/" + child):
                        prefixes.add(child_path[: -len(child) - 1].encode())
            except (ValueError, AttributeError):
                pass  # check_kernel_files reports the unusable group file
    for name, data in files.items():
        if name.endswith(".json"):
            if _REPLACE in data:
                raise PackError(f"{name}: already contains {REPLACE_SENTINEL}; refusing to pack")
            for prefix in sorted(prefixes, key=len, reverse=True):
                data = data.replace(prefix, _REPLACE)
            files[name] = data
    return files


def pack_kernel_dir(
    path: str | os.PathLike[str], producer: Producer | None = None, level: int = 3
) -> tuple[KernelManifest, bytes]:
    """Pack a local Triton kernel dir (named by its key) into checked pack bytes."""
    files = read_kernel_dir(path)
    manifest = manifest_for_files(Path(path).name, files, producer)
    return manifest, build_pack(manifest, files, level)


def substitute_dir(files: Mapping[str, bytes], final_dir: str) -> dict[str, bytes]:
    """``[REPLACE]`` → the kernel dir's real path in ``.json`` files, as ``read_and_emit`` does."""
    real = final_dir.encode()
    return {n: d.replace(_REPLACE, real) if n.endswith(".json") else d for n, d in files.items()}
