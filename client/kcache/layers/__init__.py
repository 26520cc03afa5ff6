"""The cache layers: one module per thing of torch's, Triton's or vLLM's that kcache serves, each
installed into the host process and uninstalled again. Every layer implements one interface
(:class:`.protocol.Layer`) and has one line in :mod:`.layer_registry`, which activation walks.

Sub-wings by host framework: :mod:`.inductor` (Inductor's remote caches, the TritonBundler hooks,
FX-graph reads and key components, autotune fixes), :mod:`.triton` (Triton's cache manager and
kernel key parts), :mod:`.dynamo` (Dynamo precompile packages), :mod:`.jit` (JIT builders' native
modules); :mod:`.vllm_compile_cache` is vLLM's. What several layers share: the context a key was
computed in (:mod:`.key_context`), the key-soundness canary (:mod:`.key_canary`) and
``KCACHE_REQUIRE_HIT`` (:mod:`.require_hit`).

Kept import-free: Triton imports ``kcache.triton_manager`` (through this package) for every
kernel it loads.
"""
