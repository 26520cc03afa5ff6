# Triton kernel parameters are untyped by design (the JIT infers them at specialisation).
# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""A corpus of real Triton kernel cache dirs, compiled on a CPU-only machine.

Benchmarks and tests of kcache need realistic cache entries: the exact files Triton writes
(``.source .ttir .ttgir .llir .ptx .cubin <name>.json __grp__<name>.json``) with realistic
sizes and a realistic spread of shapes.  Triton compiles all the way to a cubin for an
explicit ``GPUTarget`` without a GPU or a driver (ptxas ships in the wheel), so we generate
them for real instead of faking bytes.

The corpus is a fixed, deterministic list of ``KernelSpec``: the cartesian product of kernel
family x constexpr block sizes x num_warps x num_stages x dtype x arch, shuffled with a fixed
seed per family and interleaved round-robin across families, so any prefix of N specs mixes
all families and both archs.  Same N -> same specs -> same cache keys for a given triton
version and environment.

Public API::

    corpus_specs(n, *, archs=(90, 80)) -> list[KernelSpec]
    make_corpus(dest, n, *, archs=(90, 80), jobs=None) -> list[Path]
    compile_specs(dest, specs, *, jobs=None) -> dict[str, Path]
    cached_corpus(n, *, archs=(90, 80), jobs=None) -> Path
    compile_small(dest, count=3, arch=90) -> list[Path]

CLI::

    python -m kcache_testkit.corpus --n 500 [--dest DIR] [--archs 90,80] [--jobs N]

Note: triton's ``__grp__<name>.json`` stores *absolute* paths of the files in the kernel dir,
so a kernel dir copied elsewhere is only a cache hit after those paths are rewritten.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# Environment every corpus compile runs under.  TRITON_DEFAULT_FP_FUSION is one of triton's
# cache-invalidating variables (it enters the cache key), so it must be identical for every
# compile or the "same N -> same keys" promise breaks; setting it also silences triton 3.9's
# UserWarning about the fp-fusion default.
COMPILE_ENV: dict[str, str] = {"TRITON_DEFAULT_FP_FUSION": "1"}

DEFAULT_ARCHS: tuple[int, ...] = (90, 80)

# Where cached_corpus keeps its corpora (git-ignored).
# In bench/ (git-ignored), where the benchmarks that use it live.
CORPUS_ROOT = Path(__file__).resolve().parent.parent / "bench" / ".corpus"

# Max dynamic shared memory per block; matmul configs above it would be pruned by any real
# autotuner (they fail at load time with "out of resource"), so they are not in the corpus.
_SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024}


# --------------------------------------------------------------------------------------------
# Kernels.  Written like the Triton tutorials / Inductor output so the IR is representative.
# --------------------------------------------------------------------------------------------


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def mul_add_kernel(x_ptr, y_ptr, z_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    z = tl.load(z_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y + z, mask=mask)


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    # tanh-approximate GELU; tanh spelled via exp so no libdevice call is needed.
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    y = 0.5 * x * (1.0 + t)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(x, axis=0).to(out_ptr.dtype.element_ty))


@triton.jit
def row_max_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    tl.store(out_ptr + row, tl.max(x, axis=0).to(out_ptr.dtype.element_ty))


@triton.jit
def softmax_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(out_ptr + row * stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering of program ids for L2 reuse, as in the Triton matmul tutorial.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


# --------------------------------------------------------------------------------------------
# The spec space.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
    fn: Any  # triton.JITFunction (untyped in triton)
    # Runtime args in order: "ptr" args get the spec's dtype, others are scalar type strings.
    args: tuple[tuple[str, str], ...]
    # Args that the JIT would specialize as 16-divisible for aligned torch tensors/shapes.
    div16: tuple[str, ...]
    space: Callable[[], Iterator[tuple[dict[str, int], int, int]]]  # (consts, warps, stages)


def _pointwise_space() -> Iterator[tuple[dict[str, int], int, int]]:
    for block, warps, stages in itertools.product(
        (128, 256, 512, 1024, 2048, 4096), (1, 2, 4, 8), (1, 2)
    ):
        # Fewer elements than threads is a config no autotuner would emit.
        if block >= 32 * warps:
            yield {"BLOCK": block}, warps, stages


def _row_space() -> Iterator[tuple[dict[str, int], int, int]]:
    for block, warps, stages in itertools.product(
        (256, 512, 1024, 2048, 4096, 8192), (1, 2, 4, 8, 16), (1, 2)
    ):
        if block >= 32 * warps:
            yield {"BLOCK": block}, warps, stages


def _matmul_space() -> Iterator[tuple[dict[str, int], int, int]]:
    for bm, bn, bk, warps, stages in itertools.product(
        (32, 64, 128), (32, 64, 128), (16, 32, 64, 128), (4, 8), (2, 3, 4, 5)
    ):
        yield {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, warps, stages


_ROW_ARGS = (("x_ptr", "ptr"), ("out_ptr", "ptr"), ("stride", "i32"), ("n_cols", "i32"))

FAMILIES: dict[str, _Family] = {
    "add": _Family(
        add_kernel,
        (("x_ptr", "ptr"), ("y_ptr", "ptr"), ("out_ptr", "ptr"), ("n", "i32")),
        ("x_ptr", "y_ptr", "out_ptr", "n"),
        _pointwise_space,
    ),
    "mul_add": _Family(
        mul_add_kernel,
        (("x_ptr", "ptr"), ("y_ptr", "ptr"), ("z_ptr", "ptr"), ("out_ptr", "ptr"), ("n", "i32")),
        ("x_ptr", "y_ptr", "z_ptr", "out_ptr", "n"),
        _pointwise_space,
    ),
    "gelu": _Family(
        gelu_kernel,
        (("x_ptr", "ptr"), ("out_ptr", "ptr"), ("n", "i32")),
        ("x_ptr", "out_ptr", "n"),
        _pointwise_space,
    ),
    "row_sum": _Family(row_sum_kernel, _ROW_ARGS, ("x_ptr", "out_ptr", "stride"), _row_space),
    "row_max": _Family(row_max_kernel, _ROW_ARGS, ("x_ptr", "out_ptr", "stride"), _row_space),
    "softmax": _Family(softmax_kernel, _ROW_ARGS, ("x_ptr", "out_ptr", "stride"), _row_space),
    "layernorm": _Family(
        layernorm_kernel,
        (
            ("x_ptr", "ptr"),
            ("w_ptr", "ptr"),
            ("b_ptr", "ptr"),
            ("out_ptr", "ptr"),
            ("stride", "i32"),
            ("n_cols", "i32"),
            ("eps", "fp32"),
        ),
        ("x_ptr", "w_ptr", "b_ptr", "out_ptr", "stride"),
        _row_space,
    ),
    "matmul": _Family(
        matmul_kernel,
        (
            ("a_ptr", "ptr"),
            ("b_ptr", "ptr"),
            ("c_ptr", "ptr"),
            *((name, "i32") for name in ("M", "N", "K")),
            *((name, "i32") for name in ("stride_am", "stride_ak", "stride_bk")),
            *((name, "i32") for name in ("stride_bn", "stride_cm", "stride_cn")),
        ),
        ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"),
        _matmul_space,
    ),
}

DTYPES: tuple[str, ...] = ("fp32", "fp16")
_DTYPE_BYTES = {"fp32": 4, "fp16": 2}


@dataclass(frozen=True, order=True)
class KernelSpec:
    """One compile: a kernel family specialised by constexprs, launch options, dtype, arch."""

    family: str
    dtype: str
    consts: tuple[tuple[str, int], ...]
    num_warps: int
    num_stages: int
    arch: int

    @property
    def name(self) -> str:
        """Stable human-readable id, unique within the corpus (used in the manifest)."""
        consts = "-".join(f"{k}{v}" for k, v in self.consts)
        return (
            f"{self.family}-{self.dtype}-{consts}-w{self.num_warps}"
            f"-s{self.num_stages}-sm{self.arch}"
        )

    @property
    def kernel_name(self) -> str:
        """Triton's name for the kernel: the file stem inside the kernel dir."""
        return str(FAMILIES[self.family].fn.__name__)

    def source(self) -> ASTSource:
        fam = FAMILIES[self.family]
        arg_names: list[str] = list(fam.fn.arg_names)
        signature: dict[str, str] = {
            name: f"*{self.dtype}" if kind == "ptr" else kind for name, kind in fam.args
        }
        consts = dict(self.consts)
        # The JIT puts constexprs in the signature too; do the same so keys look like its keys.
        signature.update({name: "constexpr" for name in consts})
        attrs = {(arg_names.index(a),): [["tt.divisibility", 16]] for a in fam.div16}
        return ASTSource(fam.fn, signature, constexprs=consts, attrs=attrs)

    def target(self) -> GPUTarget:
        return GPUTarget("cuda", self.arch, 32)

    def options(self) -> dict[str, int]:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


def _fits(spec: KernelSpec) -> bool:
    if spec.family != "matmul":
        return True
    c = dict(spec.consts)
    tile = (c["BLOCK_M"] * c["BLOCK_K"] + c["BLOCK_K"] * c["BLOCK_N"]) * _DTYPE_BYTES[spec.dtype]
    return tile * spec.num_stages <= _SMEM_LIMIT[spec.arch]


def _family_specs(family: str, archs: Iterable[int]) -> list[KernelSpec]:
    arch_set = set(archs)
    specs = [
        KernelSpec(family, dtype, tuple(consts.items()), warps, stages, arch)
        for consts, warps, stages in FAMILIES[family].space()
        for dtype in DTYPES
        for arch in sorted(_SMEM_LIMIT)
    ]
    # Shuffle the *full* (all-arch) list with a fixed string seed (str seeds hash with sha512,
    # independent of PYTHONHASHSEED), then filter: for a given archs set every N is a prefix of
    # N+1, which cached_corpus relies on.
    random.Random(f"kcache-corpus-{family}").shuffle(specs)
    return [s for s in specs if s.arch in arch_set and _fits(s)]


def all_specs(archs: Sequence[int] = DEFAULT_ARCHS) -> list[KernelSpec]:
    """The whole deterministic corpus for ``archs``, families interleaved round-robin."""
    unknown = set(archs) - set(_SMEM_LIMIT)
    if unknown:
        raise ValueError(f"unsupported arch(s) {sorted(unknown)}; known: {sorted(_SMEM_LIMIT)}")
    per_family = [_family_specs(f, archs) for f in FAMILIES]
    out: list[KernelSpec] = []
    for group in itertools.zip_longest(*per_family):
        out.extend(s for s in group if s is not None)
    return out


def corpus_specs(n: int, *, archs: Sequence[int] = DEFAULT_ARCHS) -> list[KernelSpec]:
    """The first ``n`` specs of the deterministic corpus."""
    specs = all_specs(archs)
    if not 0 <= n <= len(specs):
        raise ValueError(f"n={n} out of range: the corpus for archs {archs} has {len(specs)}")
    return specs[:n]


# --------------------------------------------------------------------------------------------
# Compiling.
# --------------------------------------------------------------------------------------------


def _kernel_dir_name(hash_hex: str) -> str:
    # Same encoding as triton.runtime.cache._base32 (private, so not imported).
    return base64.b32encode(bytes.fromhex(hash_hex)).decode("ascii").rstrip("=")


def _compile(spec: KernelSpec, dest: Path) -> Path:
    """Compile one spec; TRITON_CACHE_DIR must already point at ``dest``."""
    try:
        compiled = triton.compile(spec.source(), target=spec.target(), options=spec.options())
    except Exception as exc:  # name the spec: triton's errors don't say which config failed
        raise RuntimeError(f"compiling {spec.name} failed: {exc}") from exc
    kdir = dest / _kernel_dir_name(compiled.hash)
    if not (kdir / f"__grp__{spec.kernel_name}.json").is_file():
        raise RuntimeError(f"{spec.name}: expected kernel dir {kdir} was not written")
    return kdir


def _worker_init(dest: str) -> None:
    # Triton reads TRITON_CACHE_DIR lazily (knobs.cache.dir looks at os.environ on each
    # access), so setting it here, after the module import pulled in triton, still counts.
    os.environ["TRITON_CACHE_DIR"] = dest
    os.environ.update(COMPILE_ENV)


def _worker_compile(spec: KernelSpec) -> tuple[str, str]:
    dest = os.environ["TRITON_CACHE_DIR"]
    # Guard the assumption above: if triton ever snapshots the dir at import, fail loudly
    # instead of silently filling ~/.triton/cache.
    if os.path.realpath(triton.knobs.cache.dir) != os.path.realpath(dest):
        raise RuntimeError(f"triton cache dir is {triton.knobs.cache.dir!r}, expected {dest!r}")
    return spec.name, str(_compile(spec, Path(dest)))


def _check_not_bootstrapping() -> None:
    # A script that calls into this module at top level (no ``if __name__ == "__main__"``)
    # is re-run by every spawn worker while it bootstraps.  multiprocessing would raise for
    # the nested pool, but cached_corpus's worker would first block forever on the flock its
    # parent holds; fail fast with the real cause instead.
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "kcache_testkit.corpus called while a spawn worker imports the main module; guard the "
            'calling script with if __name__ == "__main__":'
        )


def compile_specs(
    dest: str | Path, specs: Sequence[KernelSpec], *, jobs: int | None = None
) -> dict[str, Path]:
    """Compile ``specs`` into ``dest`` with a spawn process pool; returns spec name -> kernel dir.

    Spawn rather than fork: each worker gets a fresh interpreter whose triton state (knobs,
    caches, LLVM) is not inherited from a parent that may already have compiled elsewhere.
    Kernels already in ``dest`` are triton cache hits, so re-running is cheap.
    """
    _check_not_bootstrapping()
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    if not specs:
        return {}
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(specs)))
    # ProcessPoolExecutor rather than mp.Pool: a worker that dies (OOM, or a bootstrap
    # error) raises BrokenProcessPool here instead of mp.Pool's silent respawn-and-wait.
    with ProcessPoolExecutor(
        jobs,
        mp_context=mp.get_context("spawn"),
        initializer=_worker_init,
        initargs=(str(dest),),
    ) as pool:
        try:
            return {name: Path(kdir) for name, kdir in pool.map(_worker_compile, specs)}
        except BaseException:
            # Don't sit through the rest of a 2,000-kernel queue before reporting a failure.
            pool.shutdown(cancel_futures=True)
            raise


def make_corpus(
    dest: str | Path,
    n: int,
    *,
    archs: Sequence[int] = DEFAULT_ARCHS,
    jobs: int | None = None,
) -> list[Path]:
    """Fill ``dest`` (used as TRITON_CACHE_DIR) with the first ``n`` corpus kernels.

    Returns the ``n`` kernel dirs, sorted.  ``dest`` may hold other kernel dirs too; they are
    left alone and not returned.
    """
    specs = corpus_specs(n, archs=archs)
    dirs = compile_specs(dest, specs, jobs=jobs)
    if len(set(dirs.values())) != len(specs):  # distinct specs must give distinct keys
        raise RuntimeError(f"{len(specs)} specs gave only {len(set(dirs.values()))} kernel dirs")
    return sorted(dirs.values())


@contextlib.contextmanager
def env_overlay(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in os.environ for the duration, restoring the previous state after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _compile_env(dest: Path) -> Iterator[None]:
    """In-process equivalent of _worker_init, undone on exit."""
    # scope() restores both knobs.cache's env vars and any value set programmatically; the
    # programmatic value (knobs.cache.dir = ...) would otherwise win over the env var.
    with triton.knobs.cache.scope(), env_overlay(COMPILE_ENV):
        triton.knobs.cache.dir = str(dest)
        yield


def _small_specs(count: int, arch: int) -> list[KernelSpec]:
    # Cheapest kernels first: elementwise, small blocks, fp32; each combination is distinct.
    specs = [
        KernelSpec(family, "fp32", (("BLOCK", block),), warps, 1, arch)
        for block, warps, family in itertools.product(
            (64, 128, 256, 512), (1, 2, 4), ("add", "gelu", "mul_add")
        )
    ]
    if not 0 <= count <= len(specs):
        raise ValueError(f"count={count} out of range (max {len(specs)})")
    return specs[:count]


def compile_small(dest: str | Path, count: int = 3, arch: int = 90) -> list[Path]:
    """Compile ``count`` tiny distinct kernels in-process into ``dest``; returns their dirs.

    For unit tests that need a few real kernel dirs quickly (~0.3 s each, no pool start-up).
    The caller's TRITON_CACHE_DIR / knobs are restored afterwards.
    """
    if arch not in _SMEM_LIMIT:
        raise ValueError(f"unsupported arch {arch}; known: {sorted(_SMEM_LIMIT)}")
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with _compile_env(dest):
        return sorted(_compile(spec, dest) for spec in _small_specs(count, arch))


# --------------------------------------------------------------------------------------------
# The persistent corpus.
# --------------------------------------------------------------------------------------------


def _fingerprint() -> str:
    # Anything that changes keys or contents without changing the triton version: this file
    # (kernel sources, spec space) and the cache-invalidating env triton folds into keys.
    # The whole file, not just the kernels: a JITFunction's cache key includes its starting
    # line number, so any edit above a kernel changes that kernel's key too.
    from triton._C.libtriton import get_cache_invalidating_env_vars

    with env_overlay(COMPILE_ENV):
        env = sorted(get_cache_invalidating_env_vars().items())
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(json.dumps([triton.__version__, env]).encode())
    return h.hexdigest()


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file is closed, even on a crash
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tag() -> str:
    version = "".join(c if c.isalnum() or c in ".-_" else "_" for c in triton.__version__)
    return f"triton-{version}"


def cached_corpus(n: int, *, archs: Sequence[int] = DEFAULT_ARCHS, jobs: int | None = None) -> Path:
    """A cache dir under ``bench/.corpus/triton-<version>/`` holding at least the first ``n``
    kernels for ``archs``; only the missing ones are compiled.

    The dir holds nothing but kernel dirs (it may hold more than ``n``: other n / archs share
    it).  The lock file and manifest (spec name -> kernel dir) are siblings of it, so a
    consumer can treat every entry of the dir as a kernel.  An exclusive flock serialises
    concurrent callers (e.g. pytest-xdist workers): the first compiles, the rest wait and find
    everything present.  The manifest lets a warm call return without starting triton's
    compiler or a process pool.
    """
    _check_not_bootstrapping()
    tag = _tag()
    cache_dir = CORPUS_ROOT / tag
    manifest_path = CORPUS_ROOT / f"{tag}.manifest.json"
    specs = corpus_specs(n, archs=archs)
    fingerprint = _fingerprint()
    with _flock(CORPUS_ROOT / f"{tag}.lock"):
        old: dict[str, str] = {}
        fresh = False
        try:
            data = json.loads(manifest_path.read_text())
            old = {str(k): str(v) for k, v in data["kernels"].items()}
            fresh = data.get("fingerprint") == fingerprint
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass

        if fresh:
            entries = old
            wanted = specs
        else:
            # This file or the env changed since the manifest was written, so its name -> key
            # map can't be trusted.  Recompile everything it listed plus what was asked:
            # unchanged kernels are just cache hits, and the compile results are the truth.
            entries = {}
            kept = set(old)
            wanted = [*specs, *(s for s in all_specs(tuple(_SMEM_LIMIT)) if s.name in kept)]

        def present(spec: KernelSpec) -> bool:
            kdir = entries.get(spec.name)
            return (
                kdir is not None
                and (cache_dir / kdir / f"__grp__{spec.kernel_name}.json").is_file()
            )

        missing = list({s.name: s for s in wanted if not present(s)}.values())
        if missing:
            built = compile_specs(cache_dir, missing, jobs=jobs)
            entries.update({name: kdir.name for name, kdir in built.items()})
            tmp = manifest_path.with_suffix(f".tmp.{os.getpid()}")
            tmp.write_text(json.dumps({"fingerprint": fingerprint, "kernels": entries}, indent=0))
            os.replace(tmp, manifest_path)  # readers never see a half-written manifest
        cache_dir.mkdir(parents=True, exist_ok=True)
        if not fresh:
            # Drop dirs no current spec maps to (old kernel versions, strays), so the dir
            # never mixes kernels from two versions of this file.
            listed = set(entries.values())
            for stray in cache_dir.iterdir():
                if stray.name in listed:
                    continue
                if stray.is_dir():
                    shutil.rmtree(stray)
                else:
                    stray.unlink()
    return cache_dir


# --------------------------------------------------------------------------------------------
# CLI.
# --------------------------------------------------------------------------------------------


def _dir_bytes(dirs: Iterable[Path]) -> int:
    return sum(f.stat().st_size for d in dirs for f in d.iterdir() if f.is_file())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kcache_testkit.corpus",
        description="Compile a deterministic corpus of real Triton kernels on the CPU.",
    )
    parser.add_argument("--n", type=int, required=True, help="number of kernels")
    parser.add_argument(
        "--dest", type=Path, help="cache dir to fill (default: the persistent bench/.corpus one)"
    )
    parser.add_argument("--archs", default="90,80", help="comma-separated sm archs (80, 90)")
    parser.add_argument("--jobs", type=int, help="worker processes (default: cpu count)")
    args = parser.parse_args(argv)
    archs = tuple(int(a) for a in args.archs.split(",") if a.strip())

    start = time.perf_counter()
    if args.dest is None:
        root = cached_corpus(args.n, archs=archs, jobs=args.jobs)
        # The shared dir may hold more than n kernels; report just the n asked for.
        kernels = json.loads((root.parent / f"{root.name}.manifest.json").read_text())["kernels"]
        dirs = sorted(root / kernels[s.name] for s in corpus_specs(args.n, archs=archs))
        where = root
    else:
        dirs = make_corpus(args.dest, args.n, archs=archs, jobs=args.jobs)
        where = Path(args.dest).resolve()
    elapsed = time.perf_counter() - start
    print(f"dest: {where}")
    print(f"kernel dirs: {len(dirs)}")
    print(f"total bytes: {_dir_bytes(dirs)}")
    print(f"seconds: {elapsed:.1f}")
    return 0


if __name__ == "__main__":
    # Run the copy imported as kcache_testkit.corpus, not this __main__ one: spawn workers unpickle
    # specs and functions by module name, and the kernels must live in one importable module.
    from kcache_testkit.corpus import main as _main

    sys.exit(_main())
