"""The HTTP wire, spelled once: route templates, header names, cache layer names, and the layout
of a batch-get stream. The service declares its routes and labels its metrics with these
templates; the client builds its request paths from them with :func:`path`
(huggingface_hub's ``constants.py`` habit). Nothing else in ``client/`` or ``service/`` spells a
``/v1`` path or an ``X-Kcache-*`` header.
"""

from __future__ import annotations

import enum

API = "/v1"

# ---- routes (FastAPI templates) ------------------------------------------------------------------
NAMESPACES = f"{API}/namespaces"
KERNELS = f"{API}/{{namespace}}/kernels"
KERNEL = f"{KERNELS}/{{key}}"
KERNEL_MANIFEST = f"{KERNEL}/manifest"
KERNEL_FILE = f"{KERNEL}/files/{{filename}}"
KERNELS_MISSING = f"{KERNELS}:missing"
KERNELS_BATCH_GET = f"{KERNELS}:batch-get"
# Presigned object-store URLs for many packs at once (kcache_schemas.models.BatchUrls).
KERNELS_BATCH_URLS = f"{KERNELS}:batch-urls"
ENTRIES = f"{API}/{{namespace}}/entries"
ENTRY = f"{ENTRIES}/{{layer}}/{{key}}"
# Presigned object-store URLs for many entries at once (kcache_schemas.models.EntryUrls): a
# prefetch asks once instead of one redirected GET per entry.
ENTRIES_BATCH_URLS = f"{ENTRIES}:batch-urls"
ENTRY_LIST = f"{ENTRIES}/{{layer}}"  # GET ?prefix=&limit=&cursor=: a layer's entries, paginated like KERNELS
# (kcache ls --entries; kcache explain lists the key-components layer's identity markers with it)
ENTRY_INFO = f"{ENTRY}/info"
# POST: report that torch could not load the entry (write scope); GET: the report; DELETE: lift it
# (admin). A quarantined entry answers 404 ``quarantined`` to every node and refuses re-uploads.
ENTRY_QUARANTINE = f"{ENTRY}/quarantine"
# Keys the key-soundness canary found unsound (kcache_schemas.unsound_reports): GET the namespace's
# reports; PUT (write scope) / GET one report
UNSOUND_LIST = f"{API}/{{namespace}}/unsound"
UNSOUND = f"{UNSOUND_LIST}/{{layer}}/{{key}}"
PURGE = f"{API}/{{namespace}}/purge"  # POST: delete entries by recorded key part (admin; kcache_schemas.purge)
WORKLOADS = f"{API}/{{namespace}}/workloads"
WORKLOAD = f"{WORKLOADS}/{{name}}"
RUNS = f"{API}/{{namespace}}/runs"
RUN = f"{RUNS}/{{run_id}}"
RUN_STATS = f"{RUN}/stats"
STATS_USAGE = f"{API}/{{namespace}}/stats/usage"
STATS_TOP = f"{API}/{{namespace}}/stats/top"
GC = f"{API}/{{namespace}}/gc"  # GET: budget, usage, last run; POST: run a GC (admin)
PINS = f"{API}/{{namespace}}/pins"
PIN = f"{PINS}/{{name}}"  # a pinned workload: its kernels and entries are never evicted
# PUT PIN?ahead=true: pin a workload no published run names yet (without it: 404, a typo is
# refused rather than pinned)
PIN_AHEAD = "ahead"


def path(template: str, **params: str) -> str:
    """A request path from a route template. Every parameter is one of the schemas' validated
    names (namespace, key, layer, workload, run id: URL-safe by construction)."""
    return template.format(**params)


# ---- headers -----------------------------------------------------------------------------------
OWN_HEADER_PREFIX = "X-Kcache-"  # every header of kcache's own starts so
COMPILE_TIME = "X-Kcache-Compile-Time"  # the producer's compile time, seconds: credited as saved
PRODUCER = "X-Kcache-Producer"  # kcache/<version> of the uploading client
TOTAL_SIZE = "X-Kcache-Total-Size"  # a kernel's unpacked size, on HEAD/GET
TARGET = "X-Kcache-Target"  # device_type:arch:warp_size of a kernel
# On every response of a server without tokens: it checks none, so a client that sends one can
# say so (a wrong token on an open server was accepted silently).
AUTH_MODE = "X-Kcache-Auth"
AUTH_OPEN = "open"
# On a workload view: how this service hands out stored bytes. ``presigned``: kernel packs through
# kernels:batch-urls and entry GETs answer with object-store URLs (307), so a prefetch asks for
# URLs instead of bytes. Absent: the bytes come through the service.
DOWNLOADS = "X-Kcache-Downloads"
DOWNLOADS_PRESIGNED = "presigned"


# ---- cache layers ------------------------------------------------------------------------------
class CacheLayer(str, enum.Enum):
    """What kcache caches: kernel dirs, and the opaque entries of Inductor's and Triton's caches."""

    KERNEL = "kernel"
    FX_GRAPH = "fx-graph"
    AUTOTUNE = "autotune"
    BUNDLED_AUTOTUNE = "bundled-autotune"
    AOT_AUTOGRAD = "aot-autograd"
    DYNAMO_PGO = "dynamo-pgo"
    TRITON_MODULE = "triton-module"
    DYNAMO = "dynamo"  # Dynamo's precompile packages (torch._dynamo.config.caching_precompile)
    # Native modules other JIT builders compile (Inductor's C++ kernels, ...): a container of
    # files (kcache_schemas.jit) under a content key, one adapter per builder (kcache.layers.jit.layer).
    JIT = "jit"
    # vLLM's compile cache: one entry per compiled model and rank (the AOT ``model`` file with
    # the Inductor cache vLLM points at), a verified tree (kcache_schemas.tree; kcache.layers.vllm_compile_cache).
    VLLM = "vllm"
    # The named parts of a key this layer's producer computed (kcache_schemas.key_diff): what
    # `kcache explain` diffs a missed key against. Never looked up by a compile.
    KEY_COMPONENTS = "key-components"


ENTRY_LAYERS = tuple(layer.value for layer in CacheLayer if layer is not CacheLayer.KERNEL)


class ServedBy(str, enum.Enum):
    """The tier of the client's tiered store (kcache.store.tiered_store) that served a hit: the
    node's local tier as it was when asked, the workload's prefetch (brought into the tier by
    this process's prefetch, or waited for while it downloads), or the service on demand. A
    layer's ``served_by`` counts (kcache_schemas.stats_document) add up to its hits."""

    LOCAL = "local"
    PREFETCH = "prefetch"
    SERVICE = "service"


# ---- kernels:batch-get -------------------------------------------------------------------------
# A tar stream: ``index.json`` first, then ``<key>.kpack`` per found key.
BATCH_INDEX = "index.json"
BATCH_PACK_SUFFIX = ".kpack"


def batch_member(key: str) -> str:
    return key + BATCH_PACK_SUFFIX


def batch_member_key(name: str) -> str | None:
    """The key a batch-get member carries, or None for a member that is not a pack."""
    return name[: -len(BATCH_PACK_SUFFIX)] if name.endswith(BATCH_PACK_SUFFIX) else None
