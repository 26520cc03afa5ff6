"""The wire contract: identifiers that reach URLs and storage keys, and the pack manifest."""

from __future__ import annotations

import base64
import hashlib
import string
import subprocess
import sys

import pytest
from kcache_schemas import (
    InvalidKeyError,
    KernelManifest,
    normalize_entry_key,
    normalize_kernel_key,
    validate_layer,
    validate_namespace,
)
from kcache_schemas.models import validate_filename
from pydantic import ValidationError

from kcache_testkit.pace import HANG_S

_B32 = string.ascii_uppercase + "234567"


def _key_pair(seed: bytes) -> tuple[str, str]:
    digest = hashlib.sha256(seed).digest()
    return base64.b32encode(digest).decode().rstrip("="), digest.hex()


# ---- kernel keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [b"a", b"b", b"kernel", b"\x00" * 7])
def test_kernel_key_base32_and_hex_normalise_to_the_same_key(seed: bytes) -> None:
    b32, hexkey = _key_pair(seed)
    assert len(b32) == 52
    assert normalize_kernel_key(b32) == b32
    assert normalize_kernel_key(hexkey) == b32
    assert normalize_kernel_key(hexkey.upper()) == b32


@pytest.mark.torch
def test_kernel_key_matches_triton_dir_naming() -> None:
    from triton.runtime.cache import _base32

    _, hexkey = _key_pair(b"triton")
    assert normalize_kernel_key(hexkey) == _base32(hexkey)


def test_non_canonical_base32_is_rejected() -> None:
    b32, _ = _key_pair(b"canonical")
    # The last char carries 1 data bit and 4 padding bits; flipping a padding bit gives the same
    # 32 bytes under a second spelling, which must not become a second key.
    last = _B32.index(b32[-1])
    alias = b32[:-1] + _B32[last ^ 1]
    assert base64.b32decode(alias + "====") == base64.b32decode(b32 + "====")
    with pytest.raises(InvalidKeyError, match="canonical"):
        normalize_kernel_key(alias)


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "A" * 51,
        "A" * 53,
        "a" * 52,  # lower-case base32
        "A" * 51 + "1",  # '1' is not in the base32 alphabet
        "0" * 63,
        "0" * 65,
        "g" * 64,  # not hex
        "../" + "A" * 49,
        "A" * 50 + "/A",
        "A" * 51 + "\x00",
        " " + "A" * 51,
    ],
)
def test_junk_kernel_keys_are_rejected(junk: str) -> None:
    with pytest.raises(InvalidKeyError, match="kernel key"):
        normalize_kernel_key(junk)


# ---- namespaces, layers, entry keys --------------------------------------------------------------


@pytest.mark.parametrize("ok", ["default", "team-a", "prod.eu_1", "a", "0", "x" * 63])
def test_valid_namespaces(ok: str) -> None:
    assert validate_namespace(ok) == ok


@pytest.mark.parametrize("bad", ["", "Team", "-a", ".a", "_a", "a/b", "..", "a b", "x" * 64, "a\x00"])
def test_invalid_namespaces(bad: str) -> None:
    with pytest.raises(InvalidKeyError, match="namespace"):
        validate_namespace(bad)


@pytest.mark.parametrize("ok", ["fx-graph", "autotune", "bundled-autotune", "aot-autograd", "dynamo-pgo"])
def test_valid_layers(ok: str) -> None:
    assert validate_layer(ok) == ok


@pytest.mark.parametrize("bad", ["", "FX", "fx_graph", "fx/graph", "-fx", "fx.graph", "x" * 33])
def test_invalid_layers(bad: str) -> None:
    with pytest.raises(InvalidKeyError, match="layer"):
        validate_layer(bad)


@pytest.mark.parametrize(
    "ok", ["pt2:fx-graph-v1::f3kabc:c1", "abc", "A_b.c=d+e-f", "x" * 512, "_x"]
)
def test_valid_entry_keys(ok: str) -> None:
    assert normalize_entry_key(ok) == ok


@pytest.mark.parametrize("bad", ["", ".hidden", ":x", "a/b", "../x", "a b", "a\x00b", "x" * 513, "a?b"])
def test_invalid_entry_keys(bad: str) -> None:
    with pytest.raises(InvalidKeyError, match="entry key"):
        normalize_entry_key(bad)


# ---- file names inside a kernel dir -------------------------------------------------------------


@pytest.mark.parametrize(
    "ok", ["add_kernel.ptx", "__grp__add_kernel.json", "k.cubin", "_k.json", "a+b-c.llir"]
)
def test_valid_file_names(ok: str) -> None:
    assert validate_filename(ok) == ok


@pytest.mark.parametrize(
    "bad",
    ["", ".", "..", ".hidden", "a/b", "../a", "/etc/passwd", "a\x00b", "__evil", "__grp__x.ptx",
     "a\\b", "x" * 201],
)
def test_invalid_file_names(bad: str) -> None:
    with pytest.raises(ValueError, match="file name"):
        validate_filename(bad)


# ---- the manifest --------------------------------------------------------------------------------


def _manifest(**overrides: object) -> dict[str, object]:
    b32, _ = _key_pair(b"manifest")
    files = [
        {"name": n, "size": 1, "sha256": "0" * 64}
        for n in ("k.json", "__grp__k.json", "k.cubin", "k.ptx")
    ]
    data: dict[str, object] = {
        "key": b32,
        "kernel_name": "k",
        "target": {"device_type": "cuda", "arch": "90", "warp_size": 32},
        "triton_version": "3.9.0",
        "files": files,
    }
    data.update(overrides)
    return data


def test_manifest_accepts_a_kernel_dir_and_normalises_a_hex_key() -> None:
    b32, hexkey = _key_pair(b"manifest")
    m = KernelManifest.model_validate(_manifest(key=hexkey))
    assert m.key == b32
    assert m.group_file == "__grp__k.json" and m.metadata_file == "k.json"
    assert m.total_size == 4
    assert m.format == "kcache-pack" and m.version == 1


def test_manifest_content_digest_ignores_file_order() -> None:
    a = KernelManifest.model_validate(_manifest())
    files = list(_manifest()["files"])  # type: ignore[call-overload]
    b = KernelManifest.model_validate(_manifest(files=files[::-1]))
    assert a.content_digest == b.content_digest
    files[2] = dict(files[2], sha256="1" * 64)
    c = KernelManifest.model_validate(_manifest(files=files))
    assert c.content_digest != a.content_digest


def test_manifest_rejects_duplicate_names() -> None:
    files = list(_manifest()["files"])  # type: ignore[call-overload]
    files.append(dict(files[2]))
    with pytest.raises(ValidationError, match=r"duplicate file names.*k\.cubin"):
        KernelManifest.model_validate(_manifest(files=files))


def test_manifest_rejects_missing_group_file() -> None:
    files = [f for f in _manifest()["files"] if f["name"] != "__grp__k.json"]  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match=r"__grp__k\.json"):
        KernelManifest.model_validate(_manifest(files=files))


def test_manifest_rejects_missing_metadata_file() -> None:
    files = [f for f in _manifest()["files"] if f["name"] != "k.json"]  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match=r"'k\.json'"):
        KernelManifest.model_validate(_manifest(files=files))


@pytest.mark.parametrize(
    "change",
    [
        {"key": "not-a-key"},
        {"format": "zip"},
        {"version": 2},
        {"kernel_name": "../k"},
        {"target": {"device_type": "tpu", "arch": "90", "warp_size": 32}},
        {"target": {"device_type": "cuda", "arch": "", "warp_size": 32}},
        {"target": {"device_type": "cuda", "arch": "90", "warp_size": 0}},
        {"triton_version": ""},
        {"unexpected": 1},
        {"files": [{"name": "k.json", "size": 1, "sha256": "0" * 64}]},
    ],
)
def test_manifest_rejects_bad_fields(change: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KernelManifest.model_validate(_manifest(**change))


@pytest.mark.parametrize(
    "bad_file",
    [
        {"name": "../k.ptx", "size": 1, "sha256": "0" * 64},
        {"name": "k.ptx", "size": -1, "sha256": "0" * 64},
        {"name": "k.ptx", "size": 1, "sha256": "0" * 63},
        {"name": "k.ptx", "size": 1, "sha256": "A" * 64},
    ],
)
def test_manifest_rejects_bad_file_entries(bad_file: dict[str, object]) -> None:
    files = [f for f in _manifest()["files"] if f["name"] != "k.ptx"]  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        KernelManifest.model_validate(_manifest(files=[*files, bad_file]))


def test_manifest_is_frozen() -> None:
    m = KernelManifest.model_validate(_manifest())
    with pytest.raises(ValidationError):
        m.key = "x"  # type: ignore[misc]


def test_the_package_exports_each_name_from_its_home_and_wire_alone_loads_no_pydantic() -> None:
    """The package loads its names on first use (Triton imports kcache's cache manager in every
    process that loads a kernel); every exported name resolves, and ``wire`` needs no pydantic."""
    import kcache_schemas

    assert sorted(kcache_schemas.__all__) == sorted([*kcache_schemas._HOME_OF, "wire"])
    for name in kcache_schemas.__all__:
        assert getattr(kcache_schemas, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kcache_schemas.nope  # noqa: B018
    probe = "import sys; from kcache_schemas import wire; print(sorted(m for m in sys.modules if m.startswith('pydantic')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=HANG_S, check=True).stdout
    assert out.strip() == "[]", out
