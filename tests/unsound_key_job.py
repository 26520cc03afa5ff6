"""A job whose cache key is made unsound on purpose, run as a fresh interpreter (a fresh node).

``UNSOUND_LAYER=fx-graph``: Inductor's FX key leaves ``UNSOUND_DROP`` (an Inductor setting) out,
the way a torch bug would: ``FxGraphHashDetails`` is wrapped to drop it from the settings it
hashes. The job sets ``cpp.inject_relu_bug_TESTING_ONLY`` to ``JOB_RELU_BUG`` (Inductor's own
switch for generating a wrong ``relu`` in C++: ``accuracy``; empty: correct code) and compiles
``relu(x) * 2 + 1``. A setting that changes only the generated code, not the graph Inductor
hashes: a node served another node's code under the unsound key computes other numbers than
eager.

``UNSOUND_LAYER=kernel``: Triton's key leaves ``num_warps`` out (``CUDAOptions.hash`` is wrapped
to hash every option but it), and the job compiles one kernel for sm_90 with ``KERNEL_NUM_WARPS``
warps; the kernel Triton hands back says how many warps it was compiled for.

kcache activates from the environment (the ``.pth``). Prints ``RESULT <json>``.
"""

from __future__ import annotations

import dataclasses
import json
import os

LAYER = os.environ["UNSOUND_LAYER"]

if LAYER == "kernel":
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDAOptions
    from triton.compiler import ASTSource

    _hash = CUDAOptions.hash

    def hash_without_warps(self: CUDAOptions) -> str:
        return _hash(dataclasses.replace(self, num_warps=4))

    CUDAOptions.hash = hash_without_warps  # type: ignore[method-assign]

    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)

    source = ASTSource(fn=scale, signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                       constexprs={"BLOCK": 256})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": int(os.environ["KERNEL_NUM_WARPS"])})
    result: dict[str, object] = {"key": compiled.hash, "num_warps": compiled.metadata.num_warps}
else:
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import codecache

    drop = os.environ["UNSOUND_DROP"]
    _init = codecache.FxGraphHashDetails.__init__

    def init_without(self: codecache.FxGraphHashDetails, *args: object, **kwargs: object) -> None:
        _init(self, *args, **kwargs)  # type: ignore[arg-type]
        self.inductor_config.pop(drop, None)

    codecache.FxGraphHashDetails.__init__ = init_without  # type: ignore[method-assign]
    inductor_config.cpp.inject_relu_bug_TESTING_ONLY = os.environ.get("JOB_RELU_BUG") or None

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + 1

    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    result = {"matches_eager": bool(torch.allclose(torch.compile(f)(x), f(x)))}

from kcache.current import get_runtime  # noqa: E402

rt = get_runtime()
if rt is not None:
    rt.close()  # flush uploads and write the stats file now
print("RESULT " + json.dumps(result))
