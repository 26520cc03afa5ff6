"""Triton's layers: kcache's tiered cache manager (``TRITON_CACHE_MANAGER``) and the parts of
Triton's kernel keys."""
