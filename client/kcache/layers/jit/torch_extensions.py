"""The ``jit`` layer's adapter for torch's C++/CUDA extension JIT (``torch.utils.cpp_extension``
``load`` / ``load_inline``; DeepSpeed ops, apex and many research repos build this way).

torch builds such an extension with ninja in ``TORCH_EXTENSIONS_DIR`` or
``~/.cache/torch_extensions/<py>_<cu|cpu>/<name>/`` (``_jit_compile`` →
``_write_ninja_file_and_build_library`` → ``_run_ninja_build``) and imports
``<name><LIB_EXT>`` from there (``_import_module_from_library``). Ninja decides what to rebuild from
its log and the files' mtimes in that dir, so a fresh node (another ``HOME``) compiles everything.

kcache keys the build by its content (:mod:`kcache.layers.jit.ninja_builds`): the ``build.ninja`` torch just
wrote (every flag torch and the user chose, the compilers, the rules), its paths named (the build
dir, torch, the Python install, ``HOME``), each source file and each header the sources include by
its sha256 (torch's own headers by torch's version), the compilers' identity, the CPU, the C
library, the Python ABI and the environment fingerprint. Hooks, each torch's original
called unguarded and kcache's part inside one fail-open guard:

* ``_write_ninja_file_and_build_library``: marks the build (its name and dir) for the hook below.
* ``_run_ninja_build``: for that build, before ninja runs, kcache looks the library up and writes it
  where torch imports it (atomically; torch holds its build dir's lock): ninja does not run, no
  compiler runs. On a miss ninja runs as before, and the library is uploaded.
* ``_import_module_from_library``: a library kcache wrote that does not import is a miss: removed,
  counted, said once, and ninja builds it.

A library that kcache wrote has no object files or ninja log beside it: a later run without kcache
lets ninja rebuild it, as on a fresh node.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kcache.config import ClientConfig, selected_layers
from kcache.current import get_runtime
from kcache.host import patching
from kcache.host.after_import import call_after_import, imported
from kcache.host.failopen import guard, warn_once
from kcache.layers.jit import layer as jit_layer

if TYPE_CHECKING:
    from kcache.layers.jit.content_keys import BuildKey
    from kcache.runtime import Runtime

PATCHES = "torch-cpp-extension"
ADAPTER = "cpp-extension"
MODULE = "torch.utils.cpp_extension"
TARGET = "target"
_WRAPPED = ("_write_ninja_file_and_build_library", "_run_ninja_build", "_import_module_from_library")
_ELF = b"\x7fELF"


@dataclass
class _Installed:
    rt: Runtime
    key: str
    build_directory: str
    ninja: Callable[[], Any]  # torch's _run_ninja_build with its arguments: ninja builds it instead


@dataclass
class Builds:
    """What the layer did for one runtime (:meth:`Runtime.layer_state`): a library written under
    the last installation is, to a new one, torch's own, as in a fresh process."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    installed: dict[str, _Installed] = field(default_factory=dict)  # library path -> what to do should it not import
    building: threading.local = field(default_factory=threading.local)  # .name: the extension being built now


def _state(rt: Runtime | None) -> Builds:
    """``rt``'s state of this layer (a throwaway where no runtime runs: nothing is kept)."""
    return rt.layer_state(Builds) if rt is not None else Builds()


def install(module: ModuleType | None = None) -> None:
    """Hook torch's extension JIT once ``torch.utils.cpp_extension`` has finished importing.
    ``module``: that module, from the ``.pth``'s import hook, which runs right after the module's
    code (importlib marks it imported only after): hooked now, since a job that imports it and
    calls ``load_inline`` may import nothing else before the build."""
    if module is not None and getattr(module, "__name__", None) == MODULE:
        _install(module)
    else:
        call_after_import(MODULE, _install)


def uninstall() -> None:
    patching.restore(PATCHES)


def _install(ext: ModuleType) -> None:
    with guard("could not hook torch's extension JIT; it builds as before"):
        rt = get_runtime()
        if rt is None or not selected(rt.config) or patching.is_patched(PATCHES):
            return
        originals: dict[str, Callable[..., Any]] = {name: f for name in _WRAPPED if callable(f := ext.__dict__.get(name))}
        if len(originals) < len(_WRAPPED) or not isinstance(getattr(ext, "LIB_EXT", None), str):
            warn_once(f"this torch's cpp_extension lacks one of {list(_WRAPPED)} or LIB_EXT; extensions are left to torch")
            return
        patching.patch(PATCHES, ext, "_write_ninja_file_and_build_library", _wrap_write(originals["_write_ninja_file_and_build_library"]))
        patching.patch(PATCHES, ext, "_run_ninja_build", _wrap_run(originals["_run_ninja_build"], ext))
        patching.patch(PATCHES, ext, "_import_module_from_library", _wrap_import(originals["_import_module_from_library"], ext))



def _wrap_write(original: Callable[..., Any]) -> Callable[..., Any]:
    def _write_ninja_file_and_build_library(*args: Any, **kwargs: Any) -> Any:
        name = kwargs.get("name", args[0] if args else None)
        building = _state(get_runtime()).building
        outer = getattr(building, "name", None)
        building.name = name if isinstance(name, str) else None
        try:
            return original(*args, **kwargs)
        finally:
            building.name = outer

    return _write_ninja_file_and_build_library


def _build_key(build_directory: str) -> BuildKey:
    from kcache.layers.jit.ninja_builds import build_key_of
    from kcache.store import fingerprint

    torch = imported("torch")
    torch_dir = os.path.dirname(getattr(torch, "__file__", "") or "")
    named = [(torch_dir, "<torch>")] if torch_dir else []
    # torch's headers are fixed by torch's version (in the fingerprint): not read.
    return build_key_of(ADAPTER, build_directory, named, [torch_dir] if torch_dir else [], fingerprint.current().model_dump())


def _a_library(files: Mapping[str, bytes]) -> None:
    if not files.get(TARGET, b"").startswith(_ELF):
        raise ValueError("the entry holds no shared object")


def _wrap_run(original: Callable[..., Any], ext: ModuleType) -> Callable[..., Any]:
    def _run_ninja_build(build_directory: str, *args: Any, **kwargs: Any) -> Any:
        rt = jit_layer.serving_runtime()
        name = getattr(_state(rt).building, "name", None) if rt is not None else None
        if rt is None or name is None or not isinstance(build_directory, str):
            return original(build_directory, *args, **kwargs)  # not a JIT library build, or kcache off
        served, key, library = False, None, os.path.join(build_directory, f"{name}{ext.LIB_EXT}")
        with guard("torch extension lookup failed; ninja builds it"):
            key = _build_key(build_directory)
            files = jit_layer.fetch(rt, key.key, ADAPTER, _a_library)
            if files is None:
                jit_layer.missed(rt, key)
            else:
                # torch holds the build dir's lock (its FileBaton) while it builds: no other
                # process of this node writes or imports the library meanwhile.
                jit_layer.install_file(library, files[TARGET])
                state = _state(rt)
                with state.lock:
                    state.installed[library] = _Installed(rt, key.key, build_directory, functools.partial(original, build_directory, *args, **kwargs))
                served = True
        if served:
            return None
        started = time.perf_counter()
        result = original(build_directory, *args, **kwargs)
        with guard("could not upload a torch extension"):
            if key is not None and os.path.isfile(library):
                with open(library, "rb") as f:
                    jit_layer.upload(rt, key.key, ADAPTER, {TARGET: f.read()}, time.perf_counter() - started)
        return result

    return _run_ninja_build


def _wrap_import(original: Callable[..., Any], ext: ModuleType) -> Callable[..., Any]:
    def _import_module_from_library(module_name: str, path: str, *args: Any, **kwargs: Any) -> Any:
        library = os.path.join(str(path), f"{module_name}{ext.LIB_EXT}")
        try:
            loaded = original(module_name, path, *args, **kwargs)
        except (ImportError, OSError) as exc:
            installed: _Installed | None = None
            with guard("could not take back a torch extension kcache wrote"):
                state = _state(get_runtime())
                with state.lock:
                    installed = state.installed.pop(library, None)
                if installed is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(library)
                    jit_layer.refuse(installed.rt, installed.key, f"the library did not import: {type(exc).__name__}: {str(exc)[:120]}")
            if installed is None:
                raise
        else:
            state = _state(get_runtime())
            with state.lock:
                state.installed.pop(library, None)
            return loaded
        installed.ninja()  # ninja builds it (torch's own call: its errors are torch's)
        return original(module_name, path, *args, **kwargs)

    return _import_module_from_library


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "torch-extensions"
STORES = (jit_layer.LAYER,)


def selected(config: ClientConfig) -> bool:
    return jit_layer.LAYER in selected_layers(config.layers)


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install(hooked)
