"""Real Triton kernels for tests: compiled for sm_90 on the CPU (no GPU needed), with the
``[REPLACE]``-form files ``TritonBundler.collect`` gives, the manifest and the pack kcache makes."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kcache_schemas.models import KernelManifest
from kcache_schemas.pack import pack_kernel_dir, read_kernel_dir


@dataclass(frozen=True)
class Kernel:
    key: str
    dir: Path
    files: dict[str, bytes]  # [REPLACE] form, as TritonBundler.collect gives them
    manifest: KernelManifest
    pack: bytes

    @property
    def name(self) -> str:
        return self.manifest.kernel_name

    @property
    def hex_key(self) -> str:
        return key_to_hex(self.key)

    @property
    def cubin(self) -> str:
        return f"{self.name}.cubin"

    @property
    def group(self) -> str:
        return f"__grp__{self.name}.json"


def key_to_hex(key: str) -> str:
    return str(base64.b32decode(key + "====").hex())


def real_kernels(dest: Path, count: int, arch: int = 90) -> list[Kernel]:
    """``count`` distinct real kernels (add / gelu / mul_add variants) compiled into ``dest``."""
    from kcache_testkit.corpus import compile_small

    out = []
    for d in compile_small(dest, count=count, arch=arch):
        manifest, pack = pack_kernel_dir(d)
        out.append(Kernel(d.name, d, read_kernel_dir(d), manifest, pack))
    return out


def large_pack(kernel: Kernel, size: int, seed: int = 0) -> bytes:
    """A valid, canonical pack of ``kernel`` whose ``.cubin`` is ``size`` random bytes, so the
    pack is about ``size`` bytes too (random bytes do not compress): the shape of a large
    autotuned pack, for memory and burst tests. The key stays valid (the ``.json`` is unchanged)."""
    import random

    from kcache_schemas.pack import build_pack, manifest_for_files

    files = dict(kernel.files)
    files[kernel.cubin] = random.Random(seed).randbytes(size)
    return build_pack(manifest_for_files(kernel.key, files), files, level=1)


def triton_cache_hits(compile_fn: Callable[[], object]) -> list[bool]:
    """Run ``compile_fn`` with a Triton compilation listener; each compile's ``cache_hit``."""
    import triton

    seen: list[bool] = []

    def listener(*, cache_hit: bool = False, **_: object) -> None:
        seen.append(cache_hit)

    old = triton.knobs.compilation.listener
    triton.knobs.compilation.listener = listener
    try:
        compile_fn()
    finally:
        triton.knobs.compilation.listener = old
    return seen
