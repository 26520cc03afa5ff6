"""The cache's domain: one module per concern, one shape for all of them.

The store is split by concern, as bazel-remote splits its disk cache (``cache/disk/``:
``disk.go``, ``lru.go``, ``load.go``, ``findmissing.go``, ...):

* :mod:`.commit`: the commit protocol (write blob → verify → index entry) and reads that repair;
* :mod:`.blob_references`: retention references (who holds a blob; deletes and evictions);
* :mod:`.storage_limits`: a namespace's soft and hard limits, checked before each upload;
* :mod:`.records`: listing and usage;
* :mod:`.access_recorder`: hits, flushed to the index in the background;
* :mod:`.kernel_packs`, :mod:`.cache_entries`, :mod:`.quarantine`: what clients store and read;
* :mod:`.workload_manifests`, :mod:`.run_reports`, :mod:`.pins`, :mod:`.unsound_keys`,
  :mod:`.key_part_purge`, :mod:`.gc`: what the service keeps about them and does with them.

**The shape.** Each concern is a class whose constructor takes the parts it uses (the index,
the blob store, other concerns) and nothing else; :class:`~.cache_store.CacheStore` builds them
all once and is the routes' one entry point (``store.kernels``, ``store.entries``, ...). A
module's free functions are pure helpers (parsing a body, matching an environment), never a
second way into storage. Why classes and not free functions over the store: most concerns own
state that must live exactly as long as the store (the usage cache of the limits, whether blob
references are complete, the access recorder's thread, the GC's observers and stop flag), and a
constructor that names its collaborators shows what each concern may touch, where a function
handed the whole store could reach anything. Nothing here knows HTTP: errors are
:mod:`kcache_server.domain_errors`, mapped to responses by :mod:`kcache_server.handlers`.
"""

from kcache_server.store.cache_store import CacheStore

__all__ = ["CacheStore"]
