"""Hooks on ``torch._inductor.triton_bundler.TritonBundler``.

We wrap the class's own methods (``begin_compile``, ``put``, ``put_winner`` where it exists,
``collect``, ``read_and_emit``) and call the originals: no torch code is copied. Features are
detected, not versions compared: the bundle is a ``TritonBundle`` with ``kernel_artifacts`` (torch
≥ 2.7) or a plain ``list[TritonKernelArtifacts]`` (before).

Every wrapper has the same shape: torch's original runs unguarded (its exceptions are torch's),
kcache's part runs inside :func:`kcache.host.failopen.guard`; a bundle of a shape we do not know goes
to the original whole. The runtime is looked up on every call, so ``kcache.install()`` with other
options, ``uninstall()`` and a later ``install()`` take effect here as everywhere else.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from kcache_schemas import normalize_kernel_key, wire
from kcache_schemas.pack import manifest_for_files

from kcache.config import ClientConfig
from kcache.current import get_runtime
from kcache.host import patching
from kcache.host.failopen import guard, warn_once
from kcache.layers.inductor import kernel_preemit
from kcache.runtime import Runtime
from kcache.store.emitter import looks_emitted, whole_by_pack

PATCHES = "bundler"
_WRAPPED = ("begin_compile", "put", "put_winner", "collect", "read_and_emit")
_REQUIRED = ("begin_compile", "put", "collect", "read_and_emit")
_EMIT_THREADS = 8


@dataclass
class Compiles:
    """The hooks' timings under one runtime (:meth:`Runtime.layer_state`): a graph whose compile
    began under another installation is credited no compile time, as in a fresh process."""

    started: threading.local = field(default_factory=threading.local)  # .t: when begin_compile ran, per compiling thread


def _kernel_artifacts(bundle: Any) -> list[Any]:
    if hasattr(bundle, "kernel_artifacts"):
        return list(bundle.kernel_artifacts)
    if isinstance(bundle, list):
        return list(bundle)
    raise TypeError(f"unrecognised TritonBundle shape: {type(bundle).__name__}")


def _with_kernels(bundle: Any, kernels: list[Any]) -> Any:
    if hasattr(bundle, "kernel_artifacts") and dataclasses.is_dataclass(bundle):
        return dataclasses.replace(bundle, kernel_artifacts=kernels)  # type: ignore[type-var]
    return kernels


def install_bundler_hooks() -> bool:
    """Wrap TritonBundler's methods (once); False, with one warning, where its shape is unknown."""
    if patching.is_patched(PATCHES):
        return True
    from torch._inductor import triton_bundler as tb_module

    cls = tb_module.TritonBundler
    originals = {name: cls.__dict__[name] for name in _WRAPPED if name in cls.__dict__}
    missing = [name for name in _REQUIRED if name not in originals]
    unknown = [n for n, f in originals.items() if not isinstance(f, (classmethod, staticmethod))]
    if missing or unknown:
        warn_once(f"this torch's TritonBundler lacks {missing} or has unknown kinds of {unknown}; Inductor bundles are left to Inductor")
        return False

    def call(name: str, *args: Any) -> Any:
        original = originals[name]
        return original.__func__(cls, *args) if isinstance(original, classmethod) else original.__func__(*args)

    def begin_compile(klass: type) -> None:
        call("begin_compile")
        with guard("TritonBundler.begin_compile hook failed"):
            if (rt := get_runtime()) is not None:
                rt.layer_state(Compiles).started.t = time.perf_counter()

    def put(klass: type, kernel_hash: str, device: int) -> None:
        call("put", kernel_hash, device)
        with guard("TritonBundler.put hook failed"):
            if (rt := get_runtime()) is not None:
                rt.note_kernel(kernel_hash)

    def put_winner(klass: type, kernel_hash: str) -> None:
        call("put_winner", kernel_hash)
        with guard("TritonBundler.put_winner hook failed"):
            if (rt := get_runtime()) is not None:
                rt.note_kernel(kernel_hash)

    def collect(klass: type) -> Any:
        result = call("collect")
        with guard("TritonBundler.collect hook failed; this graph's kernels are not uploaded"):
            if (rt := get_runtime()) is not None:
                _upload_collected(rt, result[0], getattr(rt.layer_state(Compiles).started, "t", None))
        return result

    def read_and_emit(bundle: Any) -> Any:
        prepared: tuple[Any, list[str]] | None = None
        rt = get_runtime()
        if rt is not None:
            with guard("TritonBundler.read_and_emit hook failed; Inductor emits this bundle itself"):
                if cls.is_enabled():
                    prepared = _emit_through_kcache(rt, tb_module, bundle)
        if prepared is None:
            return call("read_and_emit", bundle)
        rest, names = prepared
        metadata = call("read_and_emit", rest)
        with guard("TritonBundler.read_and_emit could not report kcache's kernels to Inductor"):
            if metadata is not None and hasattr(metadata, "cached_kernel_names") and names:
                metadata = dataclasses.replace(metadata, cached_kernel_names=names + list(metadata.cached_kernel_names))
        return metadata

    wrappers = {"begin_compile": begin_compile, "put": put, "put_winner": put_winner, "collect": collect}
    for name, fn in wrappers.items():
        if name in originals:
            patching.patch(PATCHES, cls, name, classmethod(fn))  # type: ignore[arg-type]
    patching.patch(PATCHES, cls, "read_and_emit", staticmethod(read_and_emit))
    return True


def _upload_collected(rt: Runtime, bundle: Any, started: float | None) -> None:
    elapsed = time.perf_counter() - started if started is not None else None
    kernels = _kernel_artifacts(bundle)
    for ka in kernels:
        files = {a.filename: a.payload for a in ka.artifacts}
        # The graph's compile time is shared by its kernels: credit each a fair share.
        share = elapsed / len(kernels) if elapsed is not None else None
        rt.upload_kernel(ka.kernel_hash, files, share)


def _whole_by_held_pack(rt: Runtime, cache_dir: str, key: str) -> bool:
    """The dir holds the build of this kernel that kcache's pack for the key holds (the pre-emit
    wrote it from the prefetch), whole. A bundle may carry another build of the same key whose IR
    text differs: a max-autotune graph's template kernels are compiled once in an autotune
    benchmark process and once for the graph, and their ``.ptx`` differ in a debug path (two
    bytes on H200s, every kcache node of mlp-autotune). Triton loads either; replacing a whole
    dir would cost a write and a "quarantined corrupt kernel dir" warning. Not with signing
    configured: a kernel pack is unsigned, the bundle came with a signed FX entry."""
    if rt.signing is not None:
        return False
    held = os.path.isdir(os.path.join(cache_dir, normalize_kernel_key(key)))  # else no read of the tier
    pack = rt.local.get(wire.CacheLayer.KERNEL.value, key) if held else None
    return pack is not None and whole_by_pack(cache_dir, key, pack)


def _emit_through_kcache(rt: Runtime, tb_module: Any, bundle: Any) -> tuple[Any, list[str]]:
    """Emit a bundle's kernel dirs with kcache's verified emitter; returns what is left for
    Inductor's own ``read_and_emit`` (kernels we could not emit) and the names we emitted."""
    kernels = _kernel_artifacts(bundle)
    from torch._dynamo.utils import counters
    from torch._inductor.utils import GPU_KERNEL_BIN_EXTS

    t0 = time.perf_counter()
    bin_exts = set(GPU_KERNEL_BIN_EXTS.values())
    names: list[str] = []
    fallback: list[Any] = []

    def emit(ka: Any) -> Exception | None:
        try:
            files = {a.filename: a.payload for a in ka.artifacts}
            rt.emit_local(Path(tb_module.triton_cache_dir(ka.device)), manifest_for_files(ka.kernel_hash, files), files)
            return None
        except Exception as exc:
            return exc

    def on_disk(ka: Any) -> bool:
        """A warm node's dir (its own, copied, or pre-emitted from the prefetch): nothing to write."""
        try:
            cache_dir = tb_module.triton_cache_dir(ka.device)
            found = looks_emitted(cache_dir, ka.kernel_hash, {a.filename: a.payload for a in ka.artifacts}) or (
                _whole_by_held_pack(rt, cache_dir, ka.kernel_hash))
        except Exception:
            return False
        if found:
            rt.note_kernel(ka.kernel_hash)
        return found

    # Checked first, on this thread: a few stat calls per kernel, cheaper than starting threads.
    missing = [ka for ka in kernels if not on_disk(ka)]
    # A max-autotune graph carries ~135 kernel dirs (every benchmarked candidate): written one
    # by one they took 0.4 s of an H100 warm start. The work is mostly mkdir/write/rename
    # system calls, which release the GIL, so a few threads overlap them.
    threads = min(_EMIT_THREADS, os.cpu_count() or 1, len(missing))
    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="kcache-emit") as pool:
            written = dict(zip(map(id, missing), pool.map(emit, missing), strict=True))
    else:
        written = {id(ka): emit(ka) for ka in missing}
    errors = [written.get(id(ka)) for ka in kernels]
    for ka, error in zip(kernels, errors, strict=True):
        if error is None:
            counters["inductor"]["triton_bundler_read_and_emit_kernel"] += len(ka.artifacts)
            names += [Path(a.filename).stem for a in ka.artifacts if Path(a.filename).suffix in bin_exts]
        else:
            warn_once(f"could not emit kernel {ka.kernel_hash} through kcache", error)
            fallback.append(ka)
    rt.bundle_emit_s += time.perf_counter() - t0
    return _with_kernels(bundle, fallback), names


def uninstall_bundler_hooks() -> None:
    patching.restore(PATCHES)


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "triton-bundler"
STORES = (wire.CacheLayer.KERNEL.value,)


def selected(config: ClientConfig) -> bool:
    return True


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    if install_bundler_hooks() and (rt := get_runtime()) is not None:
        with guard("could not start pre-emitting prefetched kernels"):
            kernel_preemit.start(rt)


def uninstall() -> None:
    uninstall_bundler_hooks()
