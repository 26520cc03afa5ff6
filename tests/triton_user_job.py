"""A job whose compiled function calls a user-defined Triton kernel (needs a GPU): the kernel's
source is edited between versions of the job (``USER_KERNEL_VERSION``), as users edit theirs.
kcache activates from the environment; prints ``RESULT <json>``."""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl

if os.environ.get("USER_KERNEL_VERSION", "1") == "1":

    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)

else:

    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n  # the edit: same result, another source
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=mask) * 2.0, mask=mask)


def f(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    scale[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    return out.sin() + 1


y = torch.compile(f)(torch.arange(1024.0, device="cuda"))
print("RESULT " + json.dumps(round(float(y.sum().item()), 3)))
