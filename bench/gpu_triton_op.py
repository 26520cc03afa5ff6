"""A model that calls a user-defined Triton kernel through torch.library.triton_op/wrap_triton
(for bench/gpu_e2e.py's "triton-op" workload): Inductor compiles it into its graph."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def _scale_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * alpha + y, mask=mask)


@triton_op("kcache_bench::scale_add", mutates_args={})
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(_scale_add_kernel)[(triton.cdiv(n, 1024),)](x, y, out, n, alpha, BLOCK=1024)
    return out


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    ctx.alpha = inputs[2]


def _backward(ctx, grad: torch.Tensor):  # type: ignore[no-untyped-def]
    return grad * ctx.alpha, grad, None


scale_add.register_autograd(_backward, setup_context=_setup_context)


class TritonOpModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(1024, 1024)
        self.b = torch.nn.Linear(1024, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(torch.nn.functional.gelu(scale_add(h, x, 0.5)))
