"""Pydantic models of the wire contract (JSON bodies and the manifest inside a kernel pack)."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from enum import Enum
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from kcache_schemas.keys import (
    ENTRY_KEY_PATTERN,
    KERNEL_KEY_PATTERN,
    LAYER_PATTERN,
    NAMESPACE_PATTERN,
    RUN_ID_PATTERN,
    WORKLOAD_NAME_PATTERN,
    normalize_entry_key,
    normalize_kernel_key,
    validate_layer,
    validate_namespace,
    validate_run_id,
    validate_workload_name,
)

PACK_FORMAT: Final = "kcache-pack"
PACK_FORMAT_VERSION: Final = 1
GROUP_PREFIX = "__grp__"
REPLACE_SENTINEL = "[REPLACE]"

# A file name inside a kernel dir: no separators, no NUL, no leading dot (so no "." or ".."),
# and the only double-underscore name allowed is Triton's group file.
_FILENAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# validate_filename as one ECMA-262 pattern (for documents): "__" only as __grp__<name>.json.
FILENAME_PATTERN = r"^(?!__(?!grp__.*\.json$))[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$"


def validate_filename(name: str) -> str:
    if not _FILENAME_RE.fullmatch(name):
        raise ValueError(
            f"file name {name[:80]!r} is not allowed: use [A-Za-z0-9_.+-], no '/', no leading '.'"
        )
    if name.startswith("__") and not (name.startswith(GROUP_PREFIX) and name.endswith(".json")):
        raise ValueError(f"file name {name!r}: only Triton's __grp__<name>.json may start with '__'")
    return name


def _sha256_hex(value: str) -> str:
    if not _SHA256_RE.fullmatch(value):
        raise ValueError("sha256 must be 64 lowercase hex chars")
    return value


def _pattern(pattern: str) -> WithJsonSchema:
    """The JSON schema of a string its validator checks: the validator's rule as a pattern, so
    that a client generating bodies from the OpenAPI document meets no surprise (validation
    stays the validator's, with its messages)."""
    return WithJsonSchema({"type": "string", "pattern": pattern})


KernelKey = Annotated[str, AfterValidator(normalize_kernel_key), _pattern(KERNEL_KEY_PATTERN)]
Namespace = Annotated[str, AfterValidator(validate_namespace), _pattern(NAMESPACE_PATTERN)]
Layer = Annotated[str, AfterValidator(validate_layer), _pattern(LAYER_PATTERN)]
EntryKey = Annotated[str, AfterValidator(normalize_entry_key), _pattern(ENTRY_KEY_PATTERN)]
FileName = Annotated[str, AfterValidator(validate_filename), _pattern(FILENAME_PATTERN)]
Sha256 = Annotated[str, AfterValidator(_sha256_hex), _pattern(_SHA256_RE.pattern)]
WorkloadName = Annotated[str, AfterValidator(validate_workload_name), _pattern(WORKLOAD_NAME_PATTERN)]
RunId = Annotated[str, AfterValidator(validate_run_id), _pattern(RUN_ID_PATTERN)]


class DeviceType(str, Enum):
    CUDA = "cuda"
    HIP = "hip"
    XPU = "xpu"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PackFile(_Model):
    name: FileName
    size: int = Field(ge=0)
    sha256: Sha256


class KernelTarget(_Model):
    """What hardware the kernel runs on, read from ``<name>.json``'s ``target``."""

    device_type: DeviceType
    arch: str = Field(min_length=1, max_length=32, description="e.g. '90' for sm_90, 'gfx942'")
    warp_size: int = Field(ge=1, le=1024)


class Producer(_Model):
    """Who made an entry. Versions only: nothing machine-local (no host, user or path)."""

    kcache_version: str | None = None
    torch_version: str | None = None
    triton_version: str | None = None
    # Seconds the producer spent compiling; a hit credits this as compile time saved.
    compile_time_s: float | None = Field(default=None, ge=0)


class KernelManifest(_Model):
    """The manifest inside a kernel pack: one Triton kernel dir, ``.json`` files path-free."""

    format: Literal["kcache-pack"] = PACK_FORMAT
    version: Literal[1] = PACK_FORMAT_VERSION
    key: KernelKey
    # The stem of the kernel dir's file names: the kernel's name, or its first 150 characters
    # for longer names (Triton cuts them in file names; <stem>.json's "name" keeps all of it).
    kernel_name: FileName
    target: KernelTarget
    triton_version: str = Field(min_length=1, max_length=64)
    files: list[PackFile] = Field(min_length=2, max_length=64)
    producer: Producer = Producer()

    @model_validator(mode="after")
    def _files_form_a_kernel_dir(self) -> KernelManifest:
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate file names in manifest: {dupes}")
        for required in (f"{self.kernel_name}.json", self.group_file):
            if required not in names:
                raise ValueError(f"manifest lacks {required!r}, which every Triton kernel dir has")
        return self

    @property
    def group_file(self) -> str:
        return f"{GROUP_PREFIX}{self.kernel_name}.json"

    @property
    def metadata_file(self) -> str:
        return f"{self.kernel_name}.json"

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def content_digest(self) -> str:
        """Identity of the kernel dir's contents, independent of how the pack was compressed.

        Two uploads for one key are "identical" (write-once allows the second) when this matches.
        """
        h = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.name):
            h.update(f"{f.name}\0{f.size}\0{f.sha256}\n".encode())
        return h.hexdigest()


class KernelEntry(_Model):
    """A stored kernel as the API describes it."""

    namespace: Namespace
    key: KernelKey
    kernel_name: FileName
    target: KernelTarget
    triton_version: str
    files: list[PackFile]
    total_size: int = Field(ge=0, description="bytes of the unpacked kernel dir")
    pack_size: int = Field(ge=0, description="bytes of the compressed pack")
    content_digest: Sha256
    created_at: datetime
    producer: Producer = Producer()


class KernelList(_Model):
    items: list[KernelEntry]
    next_cursor: str | None = None


class MissingRequest(_Model):
    keys: list[str] = Field(max_length=10_000)


class MissingResponse(_Model):
    missing: list[str]
    invalid: list[str] = Field(default_factory=list)


class BatchGetRequest(_Model):
    keys: list[str] = Field(min_length=1, max_length=5_000)


class BatchUrls(_Model):
    """Where to download many packs straight from the object store (``kernels:batch-urls``):
    the API tier answers the index lookups and signs URLs; the bytes never pass through it.

    ``urls``: a presigned GET URL per found key, valid ``expires_s``; ``inline``: found keys the
    service hands out no URL for (presigned downloads off, or a blob store without them): fetch
    those through ``kernels:batch-get``. ``missing`` and ``invalid`` as there."""

    urls: dict[str, str]
    inline: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    invalid: list[str] = Field(default_factory=list)
    expires_s: int = Field(default=0, ge=0)


class Provenance(BaseModel):
    """Where and how a signed entry was made: signed together with the entry (see
    :mod:`kcache_schemas.signed_envelope`). Unlike :class:`Producer` it names the producing host: a
    signed entry is meant to be traced back to the machine and the job that made it.

    Fields a newer producer adds are ignored, not refused (they are still covered by the
    signature): a mixed-version fleet keeps accepting each other's entries."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    host: str = Field(max_length=255)
    run_id: str | None = Field(default=None, max_length=128, description="run id of the producing job: its KCACHE_RUN_ID, or the id its launcher gave it (CI, SLURM, torchrun, Kubernetes)")
    created_at: datetime
    environment: dict[str, str | None] = Field(default_factory=dict, max_length=16, description="the environment fingerprint: torch, triton, cuda, hip, gpu_arch")
    kcache_version: str = Field(max_length=64)


SignatureAlg = Literal["ed25519", "hmac-sha256"]


class EntrySignature(_Model):
    """Who signed an entry, read from its envelope, and the provenance they signed."""

    alg: SignatureAlg
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    provenance: Provenance
    # True when the service checked the signature against a key registered for the namespace;
    # False when it only read the envelope (no keys registered there, or an HMAC signature,
    # which only holders of the secret can check). Consumers verify for themselves either way.
    verified: bool = False


class EntryInfo(_Model):
    """An opaque Inductor remote-cache entry (FX graph, autotune, ...). Never unpickled."""

    namespace: Namespace
    layer: Layer
    key: EntryKey
    size: int = Field(ge=0)
    sha256: Sha256
    created_at: datetime
    producer: Producer = Producer()
    signature: EntrySignature | None = None


class EntryList(_Model):
    """One page of a layer's entries, in key order; ``next_cursor`` continues after the last."""

    items: list[EntryInfo]
    next_cursor: str | None = None


class QuarantineRequest(_Model):
    """A client's report that torch could not load an entry kcache handed it."""

    reason: str = Field(min_length=1, max_length=512, description="what torch raised, e.g. 'TypeError: ...'")
    # The sha256 of the stored bytes the client got: a report about other content (a corrupt
    # local copy, an entry replaced since) leaves the stored entry alone (409).
    sha256: Sha256 | None = None


class QuarantineInfo(_Model):
    """A quarantined entry: why, when, and the entry as it was stored (its signer and
    provenance, if signed) when it was taken out of service. ``entry`` is None when the service
    no longer held it (evicted, or never stored there): the key is quarantined all the same."""

    namespace: Namespace
    layer: Layer
    key: EntryKey
    reason: str = Field(max_length=512)
    quarantined_at: datetime
    reporter: str | None = Field(default=None, max_length=256, description="kcache/<version> of the reporting client")
    entry: EntryInfo | None = None


class EnvFingerprint(_Model):
    """What must match for compiled artifacts to be reusable (see kcache.store.fingerprint)."""

    torch: str | None = None
    triton: str | None = None
    cuda: str | None = None
    hip: str | None = None
    gpu_arch: str | None = None

    @property
    def id(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.model_dump().items() if v) or "unknown environment"

    def diff(self, other: EnvFingerprint) -> str:
        mine, theirs = self.model_dump(), other.model_dump()
        return ", ".join(f"{k} {theirs[k]} -> {mine[k]}" for k in mine if mine[k] != theirs[k])


class EntryRef(_Model):
    layer: Layer
    key: EntryKey


class EntryUrlsRequest(_Model):
    entries: list[EntryRef] = Field(min_length=1, max_length=5_000)


class EntryUrl(_Model):
    layer: Layer
    key: EntryKey
    url: str
    sha256: Sha256  # of the entry's bytes: the client checks what the object store sent
    # The producer's compile time (what a GET's X-Kcache-Compile-Time carries), for "time saved".
    compile_time_s: float | None = Field(default=None, ge=0)


class EntryUrls(_Model):
    """Where to download many cache entries straight from the object store
    (``entries:batch-urls``), as :class:`BatchUrls` does for packs: one request for a prefetch's
    entries instead of one redirected GET each.

    ``urls``: a presigned GET URL per stored entry, valid ``expires_s``; ``inline``: stored
    entries the service hands out no URL for (presigned downloads off, or a blob store without
    them): GET those through the service; ``missing``: not stored, or quarantined."""

    urls: list[EntryUrl] = Field(default_factory=list)
    inline: list[EntryRef] = Field(default_factory=list)
    missing: list[EntryRef] = Field(default_factory=list)
    expires_s: int = Field(default=0, ge=0)


class WorkloadManifest(_Model):
    """Every kernel and cache entry one job used; published at exit, prefetched by the next job."""

    name: WorkloadName
    fingerprint: EnvFingerprint
    kernels: list[KernelKey] = Field(default_factory=list, max_length=200_000)
    entries: list[EntryRef] = Field(default_factory=list, max_length=200_000)


class WorkloadView(_Model):
    """The merged manifest of every published run of a workload in one environment."""

    name: str
    fingerprint: EnvFingerprint
    kernels: list[str]
    entries: list[EntryRef]
    runs: int
    other_fingerprints: list[EnvFingerprint] = Field(default_factory=list)


class WorkloadSummary(_Model):
    name: str
    runs: int
    fingerprints: list[EnvFingerprint]
