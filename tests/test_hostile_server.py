"""A hostile server cannot make the client write anything it should not.

A real HTTP server on loopback (``netfaults.FaultServer`` in ``http`` mode) answers
``GET /v1/default/kernels/<key>`` and ``POST /v1/default/kernels:batch-get`` with packs crafted
by hand (tarfile + zstandard): traversal and absolute names, NUL bytes, links, devices, wrong
sizes and digests, decompression bombs, a pack for another kernel, poisoned group files,
``[REPLACE]`` in a binary. Both ``Runtime.fetch_kernel`` (the compile path) and
``kcache pull`` (the CLI, in a subprocess) must refuse each one, count it as an error, and leave
the whole directory tree around the destination exactly as it was.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zstandard
from kcache.config import ClientConfig
from kcache.runtime import Runtime
from kcache.store.emitter import EmitOutcome
from kcache_schemas.pack import MANIFEST_NAME, MEDIA_TYPE

from kcache_testkit.kernels import Kernel, real_kernels
from kcache_testkit.netfaults import (
    FaultServer,
    Request,
    http_response,
    json_error,
    tar_stream,
    tree,
)
from kcache_testkit.pace import HANG_S
from kcache_testkit.service import clean_env

NS = "default"
GIB = 1 << 30


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> list[Kernel]:
    return real_kernels(tmp_path_factory.mktemp("hostile-triton"), count=2)


# ---- forging packs by hand ------------------------------------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(name: str, data: bytes) -> dict[str, Any]:
    return {"name": name, "size": len(data), "sha256": sha(data)}


def member(name: str, data: bytes = b"", *, size: int | None = None, **attrs: Any) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    info.mode, info.mtime = 0o644, 0
    if "\x00" in name:  # a ustar name stops at NUL; a PAX path record carries it through
        info.name = name.split("\x00")[0] or "x"
        info.pax_headers = {"path": name}
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes]], *, end: bool = True) -> bytes:
    """Raw tar blocks for these members (data padded), with or without the end-of-archive."""
    out = bytearray()
    for info, data in members:
        out += info.tobuf(tarfile.PAX_FORMAT)
        if info.isreg() and data:
            out += data + b"\0" * (-len(data) % 512)
    if end:
        out += b"\0" * 1024
    return bytes(out)


def zstd(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(raw)


def pack_of(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    return zstd(tar_bytes(members))


def manifest_member(manifest: dict[str, Any]) -> tuple[tarfile.TarInfo, bytes]:
    return member(MANIFEST_NAME, json.dumps(manifest).encode())


def forged(k: Kernel, files: dict[str, bytes], **overrides: Any) -> bytes:
    """A v1-layout pack whose manifest is recomputed from ``files`` (so digests agree)."""
    manifest = dict(k.manifest.model_dump(mode="json"), files=[entry(n, d) for n, d in files.items()], **overrides)
    return pack_of([manifest_member(manifest)] + [member(n, d) for n, d in files.items()])


def with_file(k: Kernel, name: str, data: bytes) -> dict[str, bytes]:
    return {**k.files, name: data}


_ZEROS_FRAME: list[bytes] = []


def zeros_frames(total: int) -> bytes:
    """Concatenated zstd frames that decompress to ``total`` zero bytes (``read_across_frames``)."""
    if not _ZEROS_FRAME:
        _ZEROS_FRAME.append(zstandard.ZstdCompressor(level=1).compress(b"\0" * (64 << 20)))
    assert total % (64 << 20) == 0
    return _ZEROS_FRAME[0] * (total // (64 << 20))


def bomb_after(prefix_members: list[tuple[tarfile.TarInfo, bytes]], huge: int) -> bytes:
    """The members' raw tar blocks, then ``huge`` zero bytes, as a tiny multi-frame zstd pack."""
    return zstd(tar_bytes(prefix_members, end=False)) + zeros_frames(huge)


def bomb_small_declared(a: Kernel) -> bytes:
    """The manifest (true, small sizes), the files before the cubin, then a cubin header claiming
    1.5 GiB followed by 1.5 GiB of zeros: a few KB on the wire."""
    manifest = a.manifest.model_dump(mode="json")
    head: list[tuple[tarfile.TarInfo, bytes]] = [manifest_member(manifest)]
    for f in manifest["files"]:
        if f["name"] == a.cubin:
            head.append(member(a.cubin, size=GIB + (512 << 20)))
            break
        head.append(member(f["name"], a.files[f["name"]]))
    return bomb_after(head, GIB + (512 << 20))


def hostile_packs(a: Kernel, b: Kernel, outside: Path) -> dict[str, bytes]:
    """name -> pack bytes served for kernel ``a``'s key. ``outside`` is a path beyond the dest."""
    cubin = a.files[a.cubin]
    others = {n: d for n, d in a.files.items() if n != a.cubin}
    manifest = a.manifest.model_dump(mode="json")

    def members_with_cubin_as(info: tuple[tarfile.TarInfo, bytes]) -> list[tuple[tarfile.TarInfo, bytes]]:
        out = [manifest_member(manifest)]
        for f in manifest["files"]:
            out.append(info if f["name"] == a.cubin else member(f["name"], a.files[f["name"]]))
        return out

    def group_with(child_path: str) -> bytes:
        group = json.loads(a.files[a.group])
        group["child_paths"][a.cubin] = child_path
        return json.dumps(group).encode()

    meta = json.loads(a.files[f"{a.name}.json"])
    packs: dict[str, bytes] = {
        # names
        "traversal-name": forged(a, {**others, "../../evil.cubin": cubin}),
        "traversal-member": pack_of(members_with_cubin_as(member(f"../../{a.cubin}", cubin))),
        "absolute-name": forged(a, {**others, str(outside / "abs-evil.cubin"): cubin}),
        "absolute-member": pack_of(members_with_cubin_as(member(str(outside / a.cubin), cubin))),
        "nul-name": forged(a, {**others, f"{a.cubin}\x00/../../../evil": cubin}),
        "nul-member": pack_of(members_with_cubin_as(member(f"{a.cubin}\x00/../../evil", cubin))),
        # member types
        "symlink-member": pack_of(members_with_cubin_as(member(a.cubin, size=0, type=tarfile.SYMTYPE, linkname=str(outside / "target")))),
        "symlink-extra": pack_of(
            [manifest_member(manifest)]
            + [member(f["name"], a.files[f["name"]]) for f in manifest["files"]]
            + [member("escape", size=0, type=tarfile.SYMTYPE, linkname="../../..")]
        ),
        "hardlink-member": pack_of(members_with_cubin_as(member(a.cubin, size=0, type=tarfile.LNKTYPE, linkname="/etc/passwd"))),
        "device-member": pack_of(members_with_cubin_as(member(a.cubin, size=0, type=tarfile.CHRTYPE, devmajor=1, devminor=3))),
        "fifo-member": pack_of(members_with_cubin_as(member(a.cubin, size=0, type=tarfile.FIFOTYPE))),
        "dir-member": pack_of(members_with_cubin_as(member(a.cubin, size=0, type=tarfile.DIRTYPE))),
        "duplicate-member": pack_of([*members_with_cubin_as(member(a.cubin, cubin)), member(a.cubin, b"second")]),
        "manifest-last": pack_of([*members_with_cubin_as(member(a.cubin, cubin))[1:], manifest_member(manifest)]),
        # contents
        "wrong-sha256": pack_of(
            [manifest_member(dict(manifest, files=[dict(f, sha256=sha(b"other")) if f["name"] == a.cubin else f for f in manifest["files"]]))]
            + [member(f["name"], a.files[f["name"]]) for f in manifest["files"]]
        ),
        "tampered-cubin": pack_of(members_with_cubin_as(member(a.cubin, bytes([cubin[0] ^ 1]) + cubin[1:]))),
        "wrong-size-manifest": pack_of(
            [manifest_member(dict(manifest, files=[dict(f, size=f["size"] + 1) if f["name"] == a.cubin else f for f in manifest["files"]]))]
            + [member(f["name"], a.files[f["name"]]) for f in manifest["files"]]
        ),
        "wrong-size-tar": pack_of(members_with_cubin_as(member(a.cubin, cubin[:-7]))),
        "truncated": a.pack[: len(a.pack) // 2],
        "not-zstd": b"PK\x03\x04 this is not a kernel pack" * 10,
        "empty": b"",
        # bombs
        "bomb-small-declared": bomb_small_declared(a),
        "bomb-extra-member": bomb_after(
            [manifest_member(manifest)]
            + [member(f["name"], a.files[f["name"]]) for f in manifest["files"]]
            + [member("zeros", size=GIB + (512 << 20))],
            GIB + (512 << 20),
        ),
        "bomb-huge-declared": pack_of(
            [manifest_member(dict(manifest, files=[dict(f, size=64 * GIB) if f["name"] == a.cubin else f for f in manifest["files"]]))]
        ),
        "bomb-many-files": forged(a, {**a.files, **{f"f{i}.ttir": b"x" for i in range(100)}}),
        # identity
        "other-kernels-pack": b.pack,
        "metadata-hash-of-other": forged(a, with_file(a, f"{a.name}.json", json.dumps(dict(meta, hash=json.loads(b.files[f"{b.name}.json"])["hash"])).encode())),
        # group file and sentinel
        "group-child-etc-passwd": forged(a, with_file(a, a.group, group_with("/etc/passwd"))),
        "group-child-replace-dotdot": forged(a, with_file(a, a.group, group_with("[REPLACE]/../x"))),
        "group-child-outside": forged(a, with_file(a, a.group, group_with(str(outside / a.cubin)))),
        "group-not-object": forged(a, with_file(a, a.group, b"[1, 2, 3]")),
        "replace-in-cubin": forged(a, with_file(a, a.cubin, cubin + b"[REPLACE]/../../evil")),
    }
    return packs


# ---- the hostile server -----------------------------------------------------------------------


class HostileService:
    """Answers the kernel routes the client uses with whatever the test sets."""

    def __init__(self) -> None:
        self.packs: dict[str, bytes] = {}  # key -> pack bytes for GET
        self.raw: dict[str, bytes] = {}  # path -> raw HTTP response (protocol-level hostility)
        self.batch: list[tuple[str, bytes]] | None = None  # members of the batch-get tar (after index.json)
        self.server = FaultServer("http", handler=self.handle)

    @property
    def url(self) -> str:
        return self.server.url

    def handle(self, req: Request) -> bytes:
        path = req.path.split("?")[0]
        if path in self.raw:
            return self.raw[path]
        if path == "/healthz":
            return http_response(200, b'{"status":"ok"}', {"Content-Type": "application/json"})
        if req.method == "GET" and path.startswith(f"/v1/{NS}/kernels/"):
            key = path.rsplit("/", 1)[1]
            if key in self.packs:
                return http_response(200, self.packs[key], {"Content-Type": MEDIA_TYPE})
            return json_error(404, "not_found", f"no kernel {key}")
        if req.method == "POST" and path == f"/v1/{NS}/kernels:batch-get":
            asked = json.loads(req.body)["keys"]
            members = self.batch if self.batch is not None else [(f"{k}.kpack", self.packs[k]) for k in asked if k in self.packs]
            found = [n.removesuffix(".kpack") for n, _ in members]
            index = json.dumps({"found": found, "missing": [k for k in asked if k not in found], "invalid": []}).encode()
            return http_response(200, tar_stream([("index.json", index), *members]), {"Content-Type": "application/x-tar"})
        return json_error(404, "not_found", f"no route {req.method} {path}")


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileService]:
    svc = HostileService()
    try:
        yield svc
    finally:
        svc.server.close()


@pytest.fixture(autouse=True)
def _no_kcache_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    for name in list(os.environ):
        if name.startswith("KCACHE_"):
            monkeypatch.delenv(name)
    # The local entry tier lives outside the scene, so the scene's snapshot sees only the pull.
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path_factory.mktemp("kcache-local")))


@dataclass
class Scene:
    root: Path  # everything the client could reach by a crafted path lies under here
    dest: Path  # the Triton cache dir we pull into (root/a/b/c/dest: "../" x4 stays in root)

    def snapshot(self) -> dict[str, tuple[str, int]]:
        return tree(self.root)


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    dest = tmp_path / "a" / "b" / "c" / "dest"
    dest.mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "keep.txt").write_text("bystander")
    return Scene(tmp_path, dest)


def runtime(url: str) -> Runtime:
    return Runtime(ClientConfig(url=url, mode="readonly", connect_timeout_s=2.0, read_timeout_s=20.0, retries=0))


def cli_pull(url: str, dest: Path, *keys: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kcache.cli", "pull", *keys, "--dest", str(dest), "--url", url],
        capture_output=True, text=True, timeout=HANG_S, cwd=cwd, env=clean_env(KCACHE_AUTOLOAD="0"),
    )


CASES = [
    "traversal-name", "traversal-member", "absolute-name", "absolute-member", "nul-name", "nul-member",
    "symlink-member", "symlink-extra", "hardlink-member", "device-member", "fifo-member", "dir-member",
    "duplicate-member", "manifest-last", "wrong-sha256", "tampered-cubin", "wrong-size-manifest",
    "wrong-size-tar", "truncated", "not-zstd", "empty", "bomb-small-declared", "bomb-extra-member",
    "bomb-huge-declared", "bomb-many-files", "other-kernels-pack", "metadata-hash-of-other",
    "group-child-etc-passwd", "group-child-replace-dotdot", "group-child-outside", "group-not-object",
    "replace-in-cubin",
]


def build(case: str, kernels: list[Kernel], scene: Scene) -> bytes:
    return hostile_packs(*kernels, scene.root)[case]


def test_every_case_is_built(kernels: list[Kernel], scene: Scene) -> None:
    assert set(hostile_packs(*kernels, scene.root)) == set(CASES)


# ---- the control: a good pack through the same server works -----------------------------------


@pytest.mark.slow
def test_control_good_pack_is_emitted(hostile: HostileService, kernels: list[Kernel], scene: Scene) -> None:
    a = kernels[0]
    hostile.packs = {a.key: a.pack}
    hostile.batch = None
    rt = runtime(hostile.url)
    try:
        assert rt.fetch_kernel(a.key, scene.dest) is EmitOutcome.EMITTED
        assert rt.stats.snapshot()["kernel"].hits == 1
    finally:
        rt.close()
    other = scene.root / "other-dest"
    proc = cli_pull(hostile.url, other, a.key, cwd=scene.root)
    assert proc.returncode == 0, proc.stderr
    assert (other / a.key / a.group).is_file()


# ---- the hostile packs ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_runtime_refuses(case: str, hostile: HostileService, kernels: list[Kernel], scene: Scene) -> None:
    a = kernels[0]
    hostile.packs = {a.key: build(case, kernels, scene)}
    before = scene.snapshot()
    rt = runtime(hostile.url)
    try:
        assert rt.fetch_kernel(a.key, scene.dest) is None
        snap = rt.stats.snapshot()["kernel"]
        assert (snap.errors, snap.hits, snap.misses) == (1, 0, 0), snap
        assert snap.error_kinds == {"invalid_pack": 1}, snap
    finally:
        rt.close()
    assert scene.snapshot() == before, "the hostile pack changed the filesystem"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_cli_pull_refuses(case: str, hostile: HostileService, kernels: list[Kernel], scene: Scene) -> None:
    a = kernels[0]
    hostile.packs = {a.key: build(case, kernels, scene)}
    hostile.batch = None
    before = scene.snapshot()
    proc = cli_pull(hostile.url, scene.dest, a.key, cwd=scene.dest.parent)
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"refused {a.key}" in proc.stderr, proc.stderr
    assert "1 refused" in proc.stdout, proc.stdout
    assert scene.snapshot() == before, "the hostile pack changed the filesystem"


# ---- a hostile batch-get stream ---------------------------------------------------------------


def batch_cases(kernels: list[Kernel]) -> dict[str, list[tuple[str, bytes]]]:
    a, b = kernels
    return {
        "traversal-kpack-name": [("../../evil.kpack", a.pack)],
        "absolute-kpack-name": [("/tmp/kcache-evil.kpack", a.pack)],
        "unrequested-valid-kernel": [(f"{b.key}.kpack", b.pack)],
        "requested-then-unrequested": [(f"{a.key}.kpack", b.pack), (f"{b.key}.kpack", b.pack)],
        "link-member": [(f"{a.key}.kpack", b"")],  # rewritten below into a symlink member
        "not-a-tar": [],
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", ["traversal-kpack-name", "absolute-kpack-name", "unrequested-valid-kernel",
                                  "requested-then-unrequested", "link-member", "not-a-tar"])
def test_cli_pull_refuses_hostile_batch_stream(case: str, hostile: HostileService, kernels: list[Kernel], scene: Scene) -> None:
    a = kernels[0]
    hostile.packs = {}
    hostile.batch = batch_cases(kernels)[case]
    path = f"/v1/{NS}/kernels:batch-get"
    if case == "link-member":
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tf:
            info = tarfile.TarInfo(f"{a.key}.kpack")
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tf.addfile(info)
        hostile.raw[path] = http_response(200, raw.getvalue(), {"Content-Type": "application/x-tar"})
    elif case == "not-a-tar":
        hostile.raw[path] = http_response(200, b"<html>gateway says hello</html>" * 40, {"Content-Type": "text/html"})
    before = scene.snapshot()
    try:
        proc = cli_pull(hostile.url, scene.dest, a.key, cwd=scene.dest.parent)
    finally:
        hostile.raw.pop(path, None)
        hostile.batch = None
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert scene.snapshot() == before, "the hostile stream changed the filesystem"


# ---- protocol-level hostility on the compile path -----------------------------------------------


def _key(kernels: list[Kernel]) -> str:
    return kernels[0].key


PROTOCOL_CASES: dict[str, Callable[[str], tuple[str, bytes]]] = {
    # path -> raw response
    "gzip-garbage": lambda key: (f"/v1/{NS}/kernels/{key}", http_response(200, b"\x1f\x8b not gzip at all", {"Content-Encoding": "gzip"})),
    "redirect-loop": lambda key: (f"/v1/{NS}/kernels/{key}", http_response(302, b"", {"Location": f"/v1/{NS}/kernels/{key}"})),
    "redirect-to-file": lambda key: (f"/v1/{NS}/kernels/{key}", http_response(302, b"", {"Location": "file:///etc/passwd"})),
    "huge-content-length": lambda key: (f"/v1/{NS}/kernels/{key}", http_response(200, b"\0" * 1024, content_length=8 * GIB)),
    "lying-short-body": lambda key: (f"/v1/{NS}/kernels/{key}", http_response(200, b"\0" * 10, content_length=1000)),
    "garbage-status-line": lambda key: (f"/v1/{NS}/kernels/{key}", b"SPDY/9 banana\r\n\r\n"),
}


@pytest.mark.parametrize("case", sorted(PROTOCOL_CASES))
def test_runtime_survives_protocol_hostility(case: str, hostile: HostileService, kernels: list[Kernel], scene: Scene) -> None:
    path, raw = PROTOCOL_CASES[case](_key(kernels))
    hostile.raw[path] = raw
    before = scene.snapshot()
    rt = runtime(hostile.url)
    try:
        assert rt.fetch_kernel(_key(kernels), scene.dest) is None
        snap = rt.stats.snapshot()["kernel"]
        assert (snap.errors, snap.hits, snap.misses) == (1, 0, 0), snap
    finally:
        rt.close()
        hostile.raw.pop(path, None)
    assert scene.snapshot() == before


def test_runtime_survives_malformed_json_answers(hostile: HostileService, kernels: list[Kernel], scene: Scene) -> None:
    key = _key(kernels)
    layer, entry_key = "fx-graph", "pt2:fx-graph-v1::hostile:c1"
    hostile.raw[f"/v1/{NS}/kernels:missing"] = http_response(200, b"{not json", {"Content-Type": "application/json"})
    hostile.raw[f"/v1/{NS}/entries/{layer}/{entry_key}"] = http_response(200, b"entry", {"X-Kcache-Compile-Time": "soon"})
    rt = runtime(hostile.url)
    try:
        assert rt.missing_kernels([key]) is None
        assert rt.get_entry(layer, entry_key) is None
        hostile.raw[f"/v1/{NS}/kernels:missing"] = http_response(200, b'{"missing": 42}', {"Content-Type": "application/json"})
        assert rt.missing_kernels([key]) is None
        snap = rt.stats.snapshot()
        assert snap["kernel"].errors == 2 and snap[layer].errors == 1, snap
        assert snap["kernel"].hits == snap[layer].hits == 0
    finally:
        rt.close()
        hostile.raw.clear()
