"""A Triton user without Inductor (hand-written kernels, as in vLLM): compiles one kernel for
sm_90 (no GPU needed) with ``KERNEL_NUM_WARPS`` warps, as a job's config would choose them.
kcache activates from the environment (the ``.pth`` and ``TRITON_CACHE_MANAGER``); prints
``RESULT <json>``: the kernel's name and whether its cubin came out."""

from __future__ import annotations

import json
import os

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)


source = ASTSource(fn=scale, signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                   constexprs={"BLOCK": 256})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": int(os.environ["KERNEL_NUM_WARPS"])})
print("RESULT " + json.dumps({"name": compiled.name, "cubin": len(compiled.asm["cubin"]) > 0}))
