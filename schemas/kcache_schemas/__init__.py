"""kcache wire contract: pydantic models, the kernel pack format, the signed-entry envelope
(``signature``), and the HTTP wire (``wire``: routes, headers, layer names, the batch-get layout).

Shared by the client (``kcache``) and the service (``kcache_server``); depends on nothing of
ours, and only on pydantic and zstandard from outside (and, to check Ed25519 signatures, on
``cryptography``, imported only then).
"""

from kcache_schemas import wire
from kcache_schemas.errors import ErrorBody, ErrorCode, PackError
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
)
from kcache_schemas.pack import PackLimits, build_pack, pack_kernel_dir, read_pack

__all__ = [
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
