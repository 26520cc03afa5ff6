"""Hooks on ``torch._inductor.triton_bundler.TritonBundler``.

We wrap the class's own methods (``begin_compile``, ``put``, ``put_winner`` where it exists,
``collect``, ``read_and_emit``) and call the originals: no torch code is copied. Features are
detected, not versions compared: the bundle is a ``TritonBundle`` with ``kernel_artifacts`` (torch
≥ 2.7) or a plain ``list[TritonKernelArtifacts]`` (before). Anything unexpected logs one warning
and falls back to Inductor's own behaviour.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kcache_schemas.pack import manifest_for_files

from kcache.emitter import looks_emitted
from kcache.runtime import Runtime

_originals: dict[str, Any] = {}
_WRAPPED = ("begin_compile", "put", "put_winner", "collect", "read_and_emit")
_EMIT_THREADS = 8


def _bundler_class() -> Any:
    from torch._inductor.triton_bundler import TritonBundler

    return TritonBundler


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


def install_bundler_hooks(rt: Runtime) -> bool:
    if _originals:
        return True
    cls = _bundler_class()
    from torch._inductor import triton_bundler as tb_module

    originals = {name: cls.__dict__[name] for name in _WRAPPED if name in cls.__dict__}
    for required in ("begin_compile", "put", "collect", "read_and_emit"):
        if required not in originals:
            rt.warn_once(f"TritonBundler has no {required}; bundler hooks not installed")
            return False
    compile_started: list[float] = []

    def call(name: str, *args: Any) -> Any:
        return originals[name].__func__(cls, *args) if isinstance(originals[name], classmethod) else originals[name].__func__(*args)

    def begin_compile(klass: type) -> None:
        call("begin_compile")
        compile_started[:] = [time.perf_counter()]

    def put(klass: type, kernel_hash: str, device: int) -> None:
        call("put", kernel_hash, device)
        try:
            rt.note_kernel(kernel_hash)
        except Exception as exc:
            rt.warn_once("TritonBundler.put hook failed", exc)

    def put_winner(klass: type, kernel_hash: str) -> None:
        call("put_winner", kernel_hash)
        try:
            rt.note_kernel(kernel_hash)
        except Exception as exc:
            rt.warn_once("TritonBundler.put_winner hook failed", exc)

    def collect(klass: type) -> Any:
        result = call("collect")
        try:
            bundle = result[0]
            elapsed = time.perf_counter() - compile_started[0] if compile_started else None
            kernels = _kernel_artifacts(bundle)
            for ka in kernels:
                files = {a.filename: a.payload for a in ka.artifacts}
                # The graph's compile time is shared by its kernels: credit each a fair share.
                share = elapsed / len(kernels) if elapsed is not None else None
                rt.upload_kernel(ka.kernel_hash, files, share)
        except Exception as exc:
            rt.warn_once("TritonBundler.collect hook failed", exc)
        return result

    def read_and_emit(bundle: Any) -> Any:
        if not cls.is_enabled():
            return call("read_and_emit", bundle)
        try:
            kernels = _kernel_artifacts(bundle)
        except TypeError as exc:
            rt.warn_once("TritonBundler.read_and_emit hook disabled", exc)
            return call("read_and_emit", bundle)
        from torch._dynamo.utils import counters
        from torch._inductor.utils import GPU_KERNEL_BIN_EXTS

        t0 = time.perf_counter()
        bin_exts = set(GPU_KERNEL_BIN_EXTS.values())
        names: list[str] = []
        fallback: list[Any] = []

        def emit(ka: Any) -> Exception | None:
            try:
                files = {a.filename: a.payload for a in ka.artifacts}
                cache_dir = Path(tb_module.triton_cache_dir(ka.device))  # type: ignore[attr-defined]
                if looks_emitted(cache_dir, ka.kernel_hash, files):  # a warm node: nothing to write
                    rt.note_kernel(ka.kernel_hash)
                    return None
                rt.emit_local(cache_dir, manifest_for_files(ka.kernel_hash, files), files)
                return None
            except Exception as exc:
                return exc

        # A max-autotune graph carries ~135 kernel dirs (every benchmarked candidate): written one
        # by one they took 0.4 s of an H100 warm start. The work is mostly mkdir/write/rename
        # system calls, which release the GIL, so a few threads overlap them.
        threads = min(_EMIT_THREADS, os.cpu_count() or 1, len(kernels))
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="kcache-emit") as pool:
                errors = list(pool.map(emit, kernels))
        else:
            errors = [emit(ka) for ka in kernels]
        for ka, error in zip(kernels, errors, strict=True):
            if error is None:
                counters["inductor"]["triton_bundler_read_and_emit_kernel"] += len(ka.artifacts)
                names += [Path(a.filename).stem for a in ka.artifacts if Path(a.filename).suffix in bin_exts]
            else:
                rt.warn_once(f"could not emit kernel {ka.kernel_hash} through kcache", error)
                fallback.append(ka)
        rt.bundle_emit_s += time.perf_counter() - t0
        metadata = call("read_and_emit", _with_kernels(bundle, fallback))
        if metadata is not None and hasattr(metadata, "cached_kernel_names"):
            metadata = dataclasses.replace(metadata, cached_kernel_names=names + list(metadata.cached_kernel_names))
        return metadata

    wrappers = {"begin_compile": begin_compile, "put": put, "put_winner": put_winner, "collect": collect}
    for name, fn in wrappers.items():
        if name in originals:
            setattr(cls, name, classmethod(fn))  # type: ignore[arg-type]
    cls.read_and_emit = staticmethod(read_and_emit)
    _originals.update(originals)
    return True


def uninstall_bundler_hooks() -> None:
    if not _originals:
        return
    cls = _bundler_class()
    for name, original in _originals.items():
        setattr(cls, name, original)
    _originals.clear()
