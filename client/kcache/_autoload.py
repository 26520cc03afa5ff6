"""Zero-code activation, run from ``kcache_autoload.pth`` at every interpreter start.

It must cost next to nothing when kcache is not wanted: with ``KCACHE_URL`` unset it returns
after one dict lookup. With it set, it adds an import hook that installs kcache right after
``torch._inductor.triton_bundler`` is first imported (i.e. when Inductor is used), so scripts
that never compile pay nothing more and no torch import is triggered early; and one that starts
kcache's runtime with only its extension JIT hooks right after ``torch.utils.cpp_extension`` or
``tvm_ffi.cpp.extension`` is imported (jobs that build extensions without Inductor; no Inductor
module is imported); and one that serves vLLM's compile cache right after
``vllm.compilation.decorators`` is imported (vLLM looks its compiled model up before it may have
imported Inductor; see docs/vllm.md).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: at start-up, importlib.abc (importlib.resources, tempfile,
    # shutil, pathlib, ...) and typing cost ~25 ms per interpreter, longer than the rest of site.
    from collections.abc import Callable
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

TRIGGER = "torch._inductor.triton_bundler"
TRITON_COMPILER = "triton.compiler.compiler"  # where Triton computes its cache keys
# torch's extension JIT (load/load_inline) and tvm-ffi's (FlashInfer's builder): jobs that build
# extensions without Inductor.
EXTENSIONS = "torch.utils.cpp_extension"
TVM_FFI_EXTENSIONS = "tvm_ffi.cpp.extension"
# vLLM's compile decorators: its compile-cache lookup may come before Inductor is imported.
VLLM_DECORATORS = "vllm.compilation.decorators"


class _Trigger:  # a meta path finder (the protocol, not the importlib.abc base class: see above)
    def __init__(self, fullname: str, then: Callable[[ModuleType], None]) -> None:
        self.fullname, self.then = fullname, then

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.fullname:
            return None
        # One-shot; also keeps the lookup below from recursing. A new list, not remove(): the
        # import system is walking this one (see kcache.host.after_import).
        sys.meta_path = [f for f in sys.meta_path if f is not self]
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RunAfter(spec.loader, self.then)  # type: ignore[assignment]
        return spec


class _RunAfter:  # a loader: runs the real one, then kcache's step; a failing step is only logged
    def __init__(self, inner: Loader, then: Callable[[ModuleType], None]) -> None:
        self._inner, self._then = inner, then

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        if name in ("_inner", "_then"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            self._then(module)
        except Exception:
            import logging

            logging.getLogger("kcache").warning("kcache: automatic activation failed", exc_info=True)


def _activate(_bundler: ModuleType) -> None:
    from kcache.host.process_roles import in_inductor_compile_sidecar

    if in_inductor_compile_sidecar():  # it never compiles: its pool workers activate, at their first job
        from kcache.layers.inductor.compile_sidecar import activate_at_first_job

        activate_at_first_job(_autoactivate)
        return
    _autoactivate()


def _autoactivate() -> None:
    from kcache.activation import autoactivate  # the client and its layers: ~0.4 s of imports

    autoactivate()


def _refuse(_module: ModuleType) -> None:
    # KCACHE_MODE (or a switch) does not parse: kcache stays off; say so once, where kcache
    # would have started (the message, naming every setting that does not parse, is config's).
    from kcache.config import settings_or_off

    settings_or_off()


def _activate_extensions(extension: ModuleType) -> None:
    from kcache.activation import activate_extensions

    activate_extensions(extension)


def _activate_vllm(decorators: ModuleType) -> None:
    from kcache.activation import activate_vllm

    activate_vllm(decorators)


def _record_kernel_keys(compiler: ModuleType) -> None:
    # Cheap (no pydantic, no network): remembers each kernel key's parts for `kcache explain`.
    from kcache.layers.triton import kernel_key_parts

    kernel_key_parts.hook(compiler)


# kcache.config's spellings of KCACHE_MODE and of a switch, again (this module imports nothing):
# tests/test_settings.py keeps them equal.
MODES_ON = ("readwrite", "read-write", "rw", "readonly", "read-only", "ro")
MODE_OFF = "off"
SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off")


def _switch(name: str) -> bool | None:
    """A switch that defaults to on; None: not a switch."""
    value = os.environ.get(name, "").strip().lower()
    return True if not value or value in SWITCH_ON else False if value in SWITCH_OFF else None


def _main() -> None:
    # Spelled as ClientConfig.from_env reads it: "OFF" must not set TRITON_CACHE_MANAGER or hook.
    mode = os.environ.get("KCACHE_MODE", "").strip().lower().replace("_", "-")
    autoload, manager = _switch("KCACHE_AUTOLOAD"), _switch("KCACHE_TRITON_MANAGER")
    if not os.environ.get("KCACHE_URL", "").strip() or mode == MODE_OFF or autoload is False:
        return
    if (mode and mode not in MODES_ON) or autoload is None or manager is None:
        # A switch that does not parse is never read as on (KCACHE_MODE=read-onyl must not
        # upload): nothing is hooked or set, and the first Inductor or Triton import says why,
        # once (kcache.config names every setting that does not parse); so does a job that only
        # builds extensions or runs vLLM.
        for module in (TRIGGER, TRITON_COMPILER, EXTENSIONS, TVM_FFI_EXTENSIONS, VLLM_DECORATORS):
            sys.meta_path.insert(0, _Trigger(module, _refuse))
        return
    # Triton looks up its cache manager per compile; set it now so that Triton users without
    # Inductor (vLLM, hand-written kernels) get kcache too. Inert unless KCACHE_URL is set.
    if manager:
        os.environ.setdefault("TRITON_CACHE_MANAGER", "kcache.triton_manager:KcacheCacheManager")
        sys.meta_path.insert(0, _Trigger(TRITON_COMPILER, _record_kernel_keys))
    if os.environ.get("KCACHE_WORKLOAD") and _claim_prefetch():
        # Start prefetching now, so downloads overlap the job's imports and model construction.
        # The client's own imports (pydantic, httpx, ~0.3 s) happen here, on the main thread:
        # a background thread importing a large module tree while the main thread runs
        # ``import torch`` is exactly the concurrency this hook must not add. The prefetch
        # thread the runtime starts then only moves bytes.
        _start_prefetch()
    for extensions in (EXTENSIONS, TVM_FFI_EXTENSIONS):
        if extensions not in sys.modules:
            sys.meta_path.insert(0, _Trigger(extensions, _activate_extensions))
    if VLLM_DECORATORS not in sys.modules:
        sys.meta_path.insert(0, _Trigger(VLLM_DECORATORS, _activate_vllm))
    if TRIGGER in sys.modules:
        from kcache.activation import autoactivate

        autoactivate()
        return
    sys.meta_path.insert(0, _Trigger(TRIGGER, _activate))


def _claim_prefetch() -> bool:
    from kcache.host.process_roles import claim_prefetch

    return claim_prefetch()


def _start_prefetch() -> None:
    try:
        from kcache.config import settings_or_off
        from kcache.current import ensure_runtime

        config = settings_or_off()  # a setting that does not parse: one warning, kcache off
        if config is not None:
            ensure_runtime(config)  # starts the kcache-prefetch thread
    except Exception:
        import logging

        logging.getLogger("kcache").warning("kcache: workload prefetch could not start", exc_info=True)


_main()
