"""This node's side of the cache: the local tier of entries (:mod:`.local_store`), the one read
path every layer takes through it (:mod:`.tiered_store`: local tier, promised prefetch, service,
back-fill; the service and the prefetch handed in by the runtime), Triton's kernel
dirs and the atomic emitter that fills them (:mod:`.kernel_dirs`, :mod:`.emitter`), the
environment's fingerprint (:mod:`.fingerprint`), the printed form of entry keys
(:mod:`.entry_keys`) and the process's counters (:mod:`.counters`).

Stands on :mod:`kcache.host` and :mod:`kcache.config`; knows nothing of the service.
"""
