"""The ``jit`` layer's adapter for tvm-ffi's C++/CUDA JIT (``apache-tvm-ffi``:
``tvm_ffi.cpp.load_inline`` / ``load`` / ``build_inline`` / ``build``; FlashInfer builds its JIT
kernels with it).

tvm-ffi writes the sources (inline ones as ``main.cpp`` / ``cuda.cu``) and a ``build.ninja`` into
``TVM_FFI_CACHE_DIR`` or ``~/.cache/tvm-ffi/<name>_<hash>/`` (the hash: of the inline sources and
flags, or of the source files' *absolute paths* for ``load``), holds that dir's ``lock`` and calls
``build_ninja(build_dir)``; ninja decides from its log and mtimes, so a fresh node (another
``HOME``, another checkout) compiles everything; ``load_module`` then loads the ``.so``.

kcache keys the build by its content (:mod:`kcache.layers.jit.ninja_builds`: ``build.ninja``'s lines with
their paths named, the sources and the headers they include by sha256, tvm-ffi's own headers by
tvm-ffi's version, the compilers' banners, the CPU, the C library, the Python ABI, the environment
fingerprint and tvm-ffi's version). Hooks on ``tvm_ffi.cpp.extension``, each tvm-ffi's original
called unguarded and kcache's part inside one fail-open guard:

* ``build_ninja``: before ninja runs (tvm-ffi holds the build dir's lock), kcache looks the
  output (``build.ninja``'s ``default`` target) up and writes it where tvm-ffi loads it,
  atomically: ninja does not run, no compiler runs. On a miss ninja runs and the output is
  uploaded.
* ``load_module``: a library kcache wrote that does not load is a miss: removed, counted, said
  once, and ninja builds it (under the build dir's lock).
"""

from __future__ import annotations

import contextlib
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

PATCHES = "tvm-ffi-jit"
ADAPTER = "tvm-ffi"
MODULE = "tvm_ffi.cpp.extension"
TARGET = "target"
_WRAPPED = ("build_ninja", "load_module")
_ELF = b"\x7fELF"


@dataclass
class _Installed:
    rt: Runtime
    key: str
    build_directory: str
    ninja: Callable[[str], Any]  # tvm-ffi's build_ninja: ninja builds it instead


@dataclass
class Builds:
    """What the layer did for one runtime (:meth:`Runtime.layer_state`): an output written under
    the last installation is, to a new one, tvm-ffi's own, as in a fresh process."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    installed: dict[str, _Installed] = field(default_factory=dict)  # real path of an output kcache wrote -> its build


def _state(rt: Runtime | None) -> Builds:
    """``rt``'s state of this layer (a throwaway where no runtime runs: nothing is kept)."""
    return rt.layer_state(Builds) if rt is not None else Builds()


def install(module: ModuleType | None = None) -> None:
    """Hook tvm-ffi's JIT once ``tvm_ffi.cpp.extension`` has finished importing (``module``: that
    module, from the ``.pth``'s import hook, which runs right after the module's code)."""
    if module is not None and getattr(module, "__name__", None) == MODULE:
        _install(module)
    else:
        call_after_import(MODULE, _install)


def uninstall() -> None:
    patching.restore(PATCHES)


def _install(ext: ModuleType) -> None:
    with guard("could not hook tvm-ffi's JIT; it builds as before"):
        rt = get_runtime()
        if rt is None or not selected(rt.config) or patching.is_patched(PATCHES):
            return
        originals: dict[str, Callable[..., Any]] = {name: f for name in _WRAPPED if callable(f := ext.__dict__.get(name))}
        if len(originals) < len(_WRAPPED):
            warn_once(f"this tvm-ffi's cpp.extension lacks one of {list(_WRAPPED)}; its JIT builds are left to it")
            return
        patching.patch(PATCHES, ext, "build_ninja", _wrap_build(originals["build_ninja"]))
        patching.patch(PATCHES, ext, "load_module", _wrap_load(originals["load_module"]))


def _package_dir(name: str) -> str:
    module = imported(name)
    return os.path.dirname(getattr(module, "__file__", "") or "") if module is not None else ""


def _build_key(build_directory: str, lines: list[str]) -> BuildKey:
    from kcache.layers.jit.ninja_builds import build_key_of
    from kcache.store import fingerprint

    tvm_dir, torch_dir = _package_dir("tvm_ffi"), _package_dir("torch")
    tvm = imported("tvm_ffi")
    environment: dict[str, str | None] = {**fingerprint.current().model_dump(), "tvm_ffi": str(getattr(tvm, "__version__", None))}
    named = [(d, n) for d, n in ((tvm_dir, "<tvm-ffi>"), (torch_dir, "<torch>")) if d]
    # tvm-ffi's (and torch's) headers are fixed by their versions, both in the key: not read.
    return build_key_of(ADAPTER, build_directory, named, [d for d, _ in named], environment, lines)


def _a_library(files: Mapping[str, bytes]) -> None:
    if not files.get(TARGET, b"").startswith(_ELF):
        raise ValueError("the entry holds no ELF file")


def _wrap_build(original: Callable[..., Any]) -> Callable[..., Any]:
    def build_ninja(build_dir: str, *args: Any, **kwargs: Any) -> Any:
        rt = jit_layer.serving_runtime()
        if rt is None or not isinstance(build_dir, (str, os.PathLike)):
            return original(build_dir, *args, **kwargs)
        directory = os.fspath(build_dir)
        served, key, output = False, None, None
        with guard("tvm-ffi build lookup failed; ninja builds it"):
            from kcache.layers.jit.ninja_builds import default_target, read_lines

            lines = read_lines(directory)
            target = default_target(lines)
            if target is not None:
                output = os.path.join(directory, target)
                key = _build_key(directory, lines)
                files = jit_layer.fetch(rt, key.key, ADAPTER, _a_library)
                if files is None:
                    jit_layer.missed(rt, key)
                else:
                    # tvm-ffi holds the build dir's lock while it builds: no other process of
                    # this node writes or loads the output meanwhile.
                    jit_layer.install_file(output, files[TARGET])
                    state = _state(rt)
                    with state.lock:
                        state.installed[os.path.realpath(output)] = _Installed(rt, key.key, directory, original)
                    served = True
        if served:
            return None
        started = time.perf_counter()
        result = original(build_dir, *args, **kwargs)
        with guard("could not upload a tvm-ffi build"):
            if key is not None and output is not None and os.path.isfile(output):
                with open(output, "rb") as f:
                    jit_layer.upload(rt, key.key, ADAPTER, {TARGET: f.read()}, time.perf_counter() - started)
        return result

    return build_ninja


def _wrap_load(original: Callable[..., Any]) -> Callable[..., Any]:
    def load_module(path: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            loaded = original(path, *args, **kwargs)
        except Exception as exc:  # tvm-ffi raises its own error types for a library it cannot load
            installed: _Installed | None = None
            with guard("could not take back a tvm-ffi build kcache wrote"):
                library = os.path.realpath(os.fspath(path))
                state = _state(get_runtime())
                with state.lock:
                    installed = state.installed.pop(library, None)
                if installed is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(library)
                    jit_layer.refuse(installed.rt, installed.key, f"the library did not load: {type(exc).__name__}: {str(exc)[:120]}")
            if installed is None:
                raise
        else:
            with guard("could not forget a tvm-ffi build kcache wrote"):
                state = _state(get_runtime())
                with state.lock:
                    state.installed.pop(os.path.realpath(os.fspath(path)), None)
            return loaded
        from tvm_ffi.utils.lockfile import FileLock

        with FileLock(os.path.join(installed.build_directory, "lock")):
            installed.ninja(installed.build_directory)  # ninja builds it (tvm-ffi's own call: its errors are tvm-ffi's)
        return original(path, *args, **kwargs)

    return load_module


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "tvm-ffi"
STORES = (jit_layer.LAYER,)


def selected(config: ClientConfig) -> bool:
    return jit_layer.LAYER in selected_layers(config.layers)


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install(hooked)
