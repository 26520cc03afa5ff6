"""``TRITON_CACHE_MANAGER=kcache.triton_manager:KcacheCacheManager``: the documented name of kcache's
Triton cache manager, kept for Triton's ``module:Class`` lookup and users' settings. The manager
itself is :mod:`kcache.layers.triton.cache_manager`."""

from kcache.layers.triton.cache_manager import KcacheCacheManager

__all__ = ["KcacheCacheManager"]
