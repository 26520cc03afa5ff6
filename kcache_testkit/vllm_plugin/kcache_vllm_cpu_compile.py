"""Test support: vLLM's real compile path on the CPU, where tests and benchmarks can run it.

vLLM's CPU platform turns ``VLLM_COMPILE`` into ``DYNAMO_TRACE_ONCE`` with stock Inductor, so the
machinery GPU users run (``VllmBackend``, piecewise ``standalone_compile``, the AOT compile cache
under ``VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/``) never runs on a CPU, and the
AOT ``model`` it writes there does not load on the next start. With
``KCACHE_TESTKIT_VLLM_CPU_COMPILE=1`` this plugin keeps ``VLLM_COMPILE`` (backend ``inductor``,
no per-size compiles: ``compile_sizes=[]``) and skips ``FixFunctionalizationPass``, which
references a CUDA-only op. Nothing else changes: the compile, its cache and its loader are
vLLM's own. Installed only into the vLLM test environment (``scripts/vllm_env.sh``), never part
of kcache.
"""

from __future__ import annotations

import os
from typing import Any

SWITCH = "KCACHE_TESTKIT_VLLM_CPU_COMPILE"


def register() -> None:
    if os.environ.get(SWITCH) != "1":
        return
    from vllm.compilation.passes.utility.fix_functionalization import FixFunctionalizationPass
    from vllm.config import CompilationMode
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.__dict__["check_and_update_config"]
    if getattr(original, "_kcache_testkit", False):
        return  # plugins load once per process, but a forked child inherits the parent's patch

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        config = vllm_config.compilation_config
        wanted = config.mode == CompilationMode.VLLM_COMPILE
        original.__func__(cls, vllm_config)
        if wanted and config.mode == CompilationMode.DYNAMO_TRACE_ONCE:
            config.mode = CompilationMode.VLLM_COMPILE
            config.backend = "inductor"
            config.compile_sizes = []

    check_and_update_config._kcache_testkit = True  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)

    def skip(self: Any, graph: Any) -> None:
        return None

    FixFunctionalizationPass.__call__ = skip
