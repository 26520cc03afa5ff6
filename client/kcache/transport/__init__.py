"""The way to the service: the HTTP client (:mod:`.http`) behind its circuit breaker
(:mod:`.breaker`), the background uploader (:mod:`.uploader`), workload publish and prefetch
(:mod:`.workload`) and the signing of entries (:mod:`.entry_signing`).

Stands on :mod:`kcache.store`, :mod:`kcache.config` and :mod:`kcache.host`.
"""
