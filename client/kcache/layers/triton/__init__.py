"""Triton's layers: kcache's tiered cache manager (``TRITON_CACHE_MANAGER``), the switch that
routes Triton to it, and the parts of Triton's kernel keys."""
