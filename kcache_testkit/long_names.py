# Triton kernel parameters are untyped by design (the JIT infers them at specialisation).
# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""A real Triton kernel whose name is longer than the 150 characters Triton keeps in file names.

Inductor names a fused kernel after every op it fuses; in training graphs those names run past
150 characters (``triton_red_fused__log_softmax_...``), and Triton then names the kernel's files
after the first 150 (``file_name = src.name[:150]`` in triton/compiler/compiler.py) while
``<file>.json``'s ``name`` keeps the whole name. Kept apart from :mod:`kcache_testkit.corpus`:
editing that file rebuilds every persistent corpus.
"""

from __future__ import annotations

from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kcache_testkit.corpus import _compile_env, _kernel_dir_name

TRITON_FILE_NAME_MAX = 150  # triton/compiler/compiler.py: file_name = src.name[:150]


@triton.jit
def triton_red_fused__log_softmax__log_softmax_backward_data_add_div_embedding_dense_backward_mul_native_layer_norm_native_layer_norm_backward_nll_loss_forward_sum_view_0(
    in_ptr, out_ptr, n, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(in_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x - tl.max(x, 0), mask=mask)


LONG_KERNEL = triton_red_fused__log_softmax__log_softmax_backward_data_add_div_embedding_dense_backward_mul_native_layer_norm_native_layer_norm_backward_nll_loss_forward_sum_view_0
LONG_NAME: str = LONG_KERNEL.__name__
assert len(LONG_NAME) > TRITON_FILE_NAME_MAX


def compile_long_name(dest: str | Path, arch: int = 90) -> Path:
    """Compile the long-named kernel for ``sm_<arch>`` into ``dest`` (a Triton cache dir, on the
    CPU); returns its kernel dir, whose files Triton named after ``LONG_NAME[:150]``."""
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    source = ASTSource(LONG_KERNEL, {"in_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                       constexprs={"BLOCK": 128})
    with _compile_env(dest):
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
    kdir = dest / _kernel_dir_name(compiled.hash)
    if not (kdir / f"__grp__{LONG_NAME[:TRITON_FILE_NAME_MAX]}.json").is_file():
        raise RuntimeError(f"Triton did not name {kdir}'s files after the first {TRITON_FILE_NAME_MAX} characters")
    return kdir
