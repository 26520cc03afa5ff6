"""kcache wire contract: pydantic models, the kernel pack format, the signed-entry envelope
(``signed_envelope``), and the HTTP wire (``wire``: routes, headers, layer names, the batch-get layout).

Shared by the client (``kcache``) and the service (``kcache_server``); depends on nothing of
ours, and only on pydantic and zstandard from outside (and, to check Ed25519 signatures, on
``cryptography``, imported only then).

The names below are loaded on first use: Triton imports kcache's cache manager in every process
that loads a kernel, and a local hit must not pay for pydantic (~150 ms); ``wire`` and
``key_diff``'s plain helpers are enough there.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcache_schemas import wire
    from kcache_schemas.error_codes import ErrorBody, ErrorCode, PackError
    from kcache_schemas.keys import (
        InvalidKeyError,
        normalize_entry_key,
        normalize_kernel_key,
        validate_layer,
        validate_namespace,
        validate_run_id,
        validate_workload_name,
    )
    from kcache_schemas.models import (
        EntryInfo,
        EntrySignature,
        KernelEntry,
        KernelManifest,
        KernelTarget,
        PackFile,
        Producer,
        Provenance,
        QuarantineInfo,
        QuarantineRequest,
    )
    from kcache_schemas.pack import PackLimits, build_pack, pack_kernel_dir, read_pack

_HOMES = {
    "error_codes": ("ErrorBody", "ErrorCode", "PackError"),
    "keys": ("InvalidKeyError", "normalize_entry_key", "normalize_kernel_key", "validate_layer", "validate_namespace",
             "validate_run_id", "validate_workload_name"),
    "models": ("EntryInfo", "EntrySignature", "KernelEntry", "KernelManifest", "KernelTarget", "PackFile", "Producer",
               "Provenance", "QuarantineInfo", "QuarantineRequest"),
    "pack": ("PackLimits", "build_pack", "pack_kernel_dir", "read_pack"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [  # spelled out for type checkers; tests/test_schemas.py checks it against _HOMES
    "EntryInfo",
    "EntrySignature",
    "ErrorBody",
    "ErrorCode",
    "InvalidKeyError",
    "KernelEntry",
    "KernelManifest",
    "KernelTarget",
    "PackError",
    "PackFile",
    "PackLimits",
    "Producer",
    "Provenance",
    "QuarantineInfo",
    "QuarantineRequest",
    "build_pack",
    "normalize_entry_key",
    "normalize_kernel_key",
    "pack_kernel_dir",
    "read_pack",
    "validate_layer",
    "validate_namespace",
    "validate_run_id",
    "validate_workload_name",
    "wire",
]


def __getattr__(name: str) -> Any:
    if name == "wire":  # a submodule: an attribute once imported, importable like the rest
        return importlib.import_module("kcache_schemas.wire")
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'kcache_schemas' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kcache_schemas.{module}"), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value
