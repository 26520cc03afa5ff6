"""The ``jit`` layer's first adapter: the C++ modules Inductor compiles itself.

On the CPU, Inductor compiles each graph's kernels into a shared object (``CppCodeCache`` and its
Python-bindings and C++-wrapper subclasses: ``load_async`` → ``_worker_compile_cpp(lock_path,
builders)`` → ``CppBuilder.build()``, the ``.so`` under ``<inductor cache dir>/<2 chars>/``), and,
on a fresh node, first a few probe libraries for the CPU's vector ISAs (``VecISA.check_build``).
An FX-graph hit from kcache carries the graph's C++ source, not the module: a fresh node still ran
the compiler for ~15 s where a node with copied cache dirs took ~2 s.

Inductor's own key for a module hashes its compile command with the absolute include dirs of the
Python install and torch, so it is not portable; kcache keys the build by its content instead
(:mod:`kcache.layers.jit.content_keys`: sources, normalised command lines, compiler, CPU, Python/torch ABI, the
environment fingerprint). Hooks, each torch's original called unguarded and kcache's part inside
one fail-open guard:

* ``_worker_compile_cpp``: before Inductor builds a module whose ``.so`` is missing, under
  Inductor's own file lock, kcache looks it up and writes it where Inductor loads it (then the
  intermediate object files of a two-step build are not needed: nothing is compiled); after a
  build, the ``.so`` is uploaded.
* ``CppCodeCache.load_async`` and ``_precompile_header``: before it builds anything, ``load_async``
  precompiles ``cpp_prefix.h`` (a preprocessor run to hash it, then a ~150 MB ``.gch``). Inside
  ``load_async``, kcache hands Inductor a plain header with the same ``#include`` instead and makes
  the real one (torch's own call, with its arguments) only when a module of this process must
  compile, pointing that module's command at it: a node that gets every module from kcache runs
  no compiler at all, a node that compiles gets what Inductor would have built.
* ``CppCodeCache._load_library``: a module kcache wrote that then does not load is a miss: removed,
  counted, said once, and Inductor compiles it.
* ``VecISA.check_build`` and ``CppBuilder.build`` (only inside ``check_build``): the ISA probe
  libraries, the same way; a probe that then fails to load is checked again by a real compile.

Features are detected, never versions compared: a torch without one of these keeps its own
behaviour for it, with one warning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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

PATCHES = "inductor-cpp"
ADAPTER = "inductor-cpp"
TARGET = "target"  # the one file of this adapter's entries: the module's shared object
_ELF = b"\x7fELF"
_HEADER_SUFFIXES = (".gch", ".pch")


@dataclass
class _Header:
    """A precompiled header Inductor asked for, made once a module of this process compiles."""

    make: Callable[[], Any]  # torch's _precompile_header with its arguments: the real header's path
    lock: threading.Lock = field(default_factory=threading.Lock)
    path: str | None = None  # the real header, once made

    def real(self) -> str | None:
        with self.lock:
            if self.path is None:
                made = self.make()
                self.path = made if isinstance(made, str) else None
            return self.path


@dataclass
class _Installed:
    """A module kcache wrote: what Inductor would have run to build it, should it not load."""

    rt: Runtime
    key: str
    lock_path: str
    builders: Any


@dataclass
class Builds:
    """What the layer did for one runtime (:meth:`Runtime.layer_state`): headers it deferred and
    modules it wrote under the last installation are, to a new one, Inductor's own, as in a
    fresh process (a deferred header's plain file still includes torch's header: it compiles)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    headers: dict[str, _Header] = field(default_factory=dict)  # the plain header kcache gave Inductor -> the real one
    installed: dict[str, _Installed] = field(default_factory=dict)  # module path -> how to build it instead
    isa_scope: threading.local = field(default_factory=threading.local)  # .probes: (rt, key, path) while VecISA.check_build runs
    load_scope: threading.local = field(default_factory=threading.local)  # .depth: > 0 while CppCodeCache.load_async runs


def _state(rt: Runtime | None) -> Builds:
    """``rt``'s state of this layer (a throwaway where no runtime runs: nothing is kept)."""
    return rt.layer_state(Builds) if rt is not None else Builds()


def install() -> None:
    """Hook Inductor's C++ builds once ``torch._inductor.codecache`` has finished importing."""
    call_after_import("torch._inductor.codecache", _install)


def uninstall() -> None:
    patching.restore(PATCHES)


def _install(codecache: ModuleType) -> None:
    with guard("could not hook Inductor's C++ builds; they compile as before"):
        rt = get_runtime()
        if rt is None or not selected(rt.config) or patching.is_patched(PATCHES):
            return  # uninstalled before codecache finished importing, or hooked already
        cpp_builder, cpu_vec_isa = imported("torch._inductor.cpp_builder"), imported("torch._inductor.cpu_vec_isa")
        worker = codecache.__dict__.get("_worker_compile_cpp")
        cache_cls = getattr(codecache, "CppCodeCache", None)
        load_library = vars(cache_cls).get("_load_library") if isinstance(cache_cls, type) else None
        builder_cls = getattr(cpp_builder, "CppBuilder", None)
        isa_cls = getattr(cpu_vec_isa, "VecISA", None)
        if not callable(worker) or not _has(builder_cls, "build", "get_command_line", "get_target_file_path"):
            warn_once("this torch has no _worker_compile_cpp(lock_path, builders)/CppBuilder; Inductor's C++ builds are left to Inductor")
            return
        patching.patch(PATCHES, codecache, "_worker_compile_cpp", _wrap_worker(worker, codecache))
        load_async = vars(cache_cls).get("load_async") if isinstance(cache_cls, type) else None
        precompile = codecache.__dict__.get("_precompile_header")
        if isinstance(load_async, classmethod) and callable(precompile):
            patching.patch(PATCHES, cache_cls, "load_async", classmethod(_wrap_load_async(load_async.__func__)))
            patching.patch(PATCHES, codecache, "_precompile_header", _wrap_precompile_header(precompile, codecache))
        if isinstance(load_library, classmethod):
            patching.patch(PATCHES, cache_cls, "_load_library", classmethod(_wrap_load_library(load_library.__func__, worker)))
        else:
            warn_once("this torch's CppCodeCache has no _load_library classmethod; a module kcache wrote that does not load fails the compile")
        if _has(isa_cls, "check_build") and "check_build" in vars(isa_cls):
            patching.patch(PATCHES, isa_cls, "check_build", _wrap_check_build(vars(isa_cls)["check_build"]))
            patching.patch(PATCHES, builder_cls, "build", _wrap_build(vars(builder_cls)["build"], codecache))


def _has(cls: Any, *names: str) -> bool:
    return isinstance(cls, type) and all(callable(getattr(cls, n, None)) for n in names)



def _chain(builders: Any) -> tuple[Any, ...] | None:
    """The builders of one ``_worker_compile_cpp`` call (a sequence; one builder in older torch)."""
    one = ("get_target_file_path", "get_command_line")
    if all(callable(getattr(builders, n, None)) for n in one):
        return (builders,)
    if isinstance(builders, (list, tuple)) and builders and all(all(callable(getattr(b, n, None)) for n in one) for b in builders):
        return tuple(builders)
    return None


@functools.lru_cache(maxsize=4)
def _path_names(cache_dir: str) -> Any:
    from kcache.layers.jit.content_keys import PathNames

    torch = imported("torch")
    torch_dir = os.path.dirname(getattr(torch, "__file__", "") or "")
    return PathNames([(cache_dir, "<inductor-cache>"), *([(torch_dir, "<torch>")] if torch_dir else [])])


def _inductor_cache_dir(codecache: ModuleType) -> str:
    for source in (getattr(codecache, "cache_dir", None), getattr(codecache, "default_cache_dir", None)):
        if callable(source):
            with contextlib.suppress(Exception):
                return str(source())
    return ""


def _build_key(codecache: ModuleType, chain: Sequence[Any]) -> BuildKey:
    from kcache.layers.jit.content_keys import Step, build_key
    from kcache.store import fingerprint

    steps = [Step(str(b.get_command_line()), str(b.get_target_file_path())) for b in chain]
    # Inductor's own memoised `-v` probe (its ISA checks run it on every node): no extra run.
    banner = getattr(imported("torch._inductor.cpp_builder"), "get_compiler_version_info", None)
    return build_key(ADAPTER, steps, _path_names(_inductor_cache_dir(codecache)), fingerprint.current().model_dump(),
                     banner if callable(banner) else None)


@contextlib.contextmanager
def _torch_lock(codecache: ModuleType, lock_path: str) -> Iterator[None]:
    """Inductor's own file lock for this module: a process compiling it finishes first."""
    try:
        from torch.utils._filelock import FileLock
    except ImportError:
        yield
        return
    with FileLock(lock_path, timeout=getattr(codecache, "LOCK_TIMEOUT", 600)):
        yield


def _serve(rt: Runtime, codecache: ModuleType, lock_path: str | None, chain: Sequence[Any]) -> tuple[bool, BuildKey | None]:
    """(whether the module is in place now, its key if one was computed). Under Inductor's lock:
    a module already there stays (a local hit, or another process built it meanwhile)."""
    final = str(chain[-1].get_target_file_path())
    with _torch_lock(codecache, lock_path) if lock_path else contextlib.nullcontext():
        if os.path.exists(final):
            return True, None
        key = _build_key(codecache, chain)
        files = jit_layer.fetch(rt, key.key, ADAPTER, _a_module if final.endswith(".so") else None)
        data = files.get(TARGET) if files is not None else None
        if data is None:
            jit_layer.missed(rt, key)
            return False, key
        jit_layer.install_file(final, data)
        return True, key


def _a_module(files: Mapping[str, bytes]) -> None:
    if not files.get(TARGET, b"").startswith(_ELF):
        raise ValueError("the entry holds no shared object")


def _is_header(chain: Sequence[Any]) -> bool:
    """A precompiled header (~150 MB, tied to this node's compiler and header files): never
    uploaded; kcache makes it unnecessary instead (see _precompile_header below)."""
    with contextlib.suppress(Exception):
        return str(chain[-1].get_target_file_path()).endswith(_HEADER_SUFFIXES)
    return True


def _upload(rt: Runtime, key: BuildKey | None, final: str, build_s: float) -> None:
    if key is None or not os.path.isfile(final):
        return
    with open(final, "rb") as f:
        data = f.read()
    jit_layer.upload(rt, key.key, ADAPTER, {TARGET: data}, build_s)


# ---- modules: _worker_compile_cpp -------------------------------------------------------------


def _wrap_worker(original: Callable[..., Any], codecache: ModuleType) -> Callable[..., Any]:
    def _worker_compile_cpp(lock_path: str, builders: Any, *rest: Any) -> Any:
        rt = jit_layer.serving_runtime()
        chain = _chain(builders) if not rest else None
        if rt is None or chain is None or _is_header(chain):
            return original(lock_path, builders, *rest)
        served, key = False, None
        with guard("Inductor C++ module lookup failed; Inductor compiles it"):
            served, key = _serve(rt, codecache, lock_path, chain)
            if served and key is not None:
                state = _state(rt)
                with state.lock:
                    state.installed[str(chain[-1].get_target_file_path())] = _Installed(rt, key.key, lock_path, builders)
        if served:
            return None
        _use_real_headers(_state(rt), chain)
        started = time.perf_counter()
        result = original(lock_path, builders)
        with guard("could not upload an Inductor C++ module"):
            _upload(rt, key, str(chain[-1].get_target_file_path()), time.perf_counter() - started)
        return result

    return _worker_compile_cpp


# ---- precompiled headers: made only for a module that compiles ---------------------------------


def _wrap_load_async(original: Callable[..., Any]) -> Callable[..., Any]:
    def load_async(cls: type, *args: Any, **kwargs: Any) -> Any:
        scope = _state(get_runtime()).load_scope
        scope.depth = getattr(scope, "depth", 0) + 1
        try:
            return original(cls, *args, **kwargs)
        finally:
            scope.depth -= 1

    return load_async


def _wrap_precompile_header(original: Callable[..., Any], codecache: ModuleType) -> Callable[..., Any]:
    def _precompile_header(*args: Any, **kwargs: Any) -> Any:
        plain: str | None = None
        # Only for CppCodeCache's modules (AOTInductor precompiles the same way, for builds that
        # do not pass through _worker_compile_cpp: those keep torch's header).
        rt = jit_layer.serving_runtime()
        if rt is not None and getattr(_state(rt).load_scope, "depth", 0) > 0:
            with guard("could not defer Inductor's precompiled header; it is built now"):
                plain = _plain_header(_state(rt), codecache, functools.partial(original, *args, **kwargs), args, kwargs)
        return plain if plain is not None else original(*args, **kwargs)

    return _precompile_header


def _plain_header(state: Builds, codecache: ModuleType, make: Callable[[], Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> str | None:
    """A header that includes what torch's precompiled one does (gcc and clang include it
    as is: there is no ``.gch`` beside it), remembered with how to make the real one."""
    header_dir = getattr(codecache, "_HEADER_DIR", None)
    header = args[0] if args else kwargs.get("header")
    command = args[1] if len(args) > 1 else kwargs.get("hashable_cmd_line")
    if not (isinstance(header_dir, str) and isinstance(header, str) and isinstance(command, str)):
        return None
    digest = hashlib.sha256("\0".join((header, command)).encode()).hexdigest()
    path = os.path.join(header_dir, f"kcache-{digest[:40]}.h")
    content = f"#include <{header}>\n".encode()
    try:
        with open(path, "rb") as f:
            present = f.read() == content
    except OSError:
        present = False
    if not present:
        jit_layer.install_file(path, content, 0o644)
    with state.lock:
        state.headers.setdefault(path, _Header(make))
    return path


def _use_real_headers(state: Builds, chain: Sequence[Any]) -> None:
    """Point the commands of ``chain`` at the precompiled headers Inductor would have given them,
    made now (torch's own call: its errors are torch's, as they were in ``load_async``)."""
    wanted: list[tuple[Any, str, _Header]] = []
    with guard("could not find the precompiled header of an Inductor C++ module; it compiles without"):
        with state.lock:
            headers = dict(state.headers)
        for builder in chain if headers else ():
            args = getattr(builder, "_include_dirs_args", None)
            tokens = shlex.split(args) if isinstance(args, str) else []
            wanted += [(builder, flag_arg, headers[flag_arg]) for flag, flag_arg in itertools.pairwise(tokens) if flag == "-include" and flag_arg in headers]
    for builder, plain, header in wanted:
        real = header.real()
        with guard("could not point an Inductor C++ build at its precompiled header; it compiles without"):
            if real is not None and real != plain:
                builder._include_dirs_args = builder._include_dirs_args.replace(f"-include {plain} ", f"-include {real} ")


# ---- a module kcache wrote that does not load ---------------------------------------------------


def _wrap_load_library(original: Callable[..., Any], worker: Callable[..., Any]) -> Callable[..., Any]:
    def _load_library(cls: type, path: str, key: str) -> Any:
        try:
            loaded = original(cls, path, key)
        except (ImportError, OSError) as exc:
            installed: _Installed | None = None
            state = _state(get_runtime())
            with guard("could not take back a C++ module kcache wrote"):
                installed = _take_back(state, cls, path, key, exc)
            if installed is None:
                raise
        else:
            state = _state(get_runtime())
            with state.lock:
                state.installed.pop(path, None)  # it loaded: nothing to take back
            return loaded
        # Compile it as Inductor would have, then load that (unguarded: torch's errors are torch's).
        _use_real_headers(state, _chain(installed.builders) or ())
        worker(installed.lock_path, installed.builders)
        return original(cls, path, key)

    return _load_library


def _take_back(state: Builds, cls: type, path: str, key: str, exc: BaseException) -> _Installed | None:
    with state.lock:
        installed = state.installed.pop(path, None)
    if installed is None:
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    # A Python extension module that failed in its init stays in sys.modules under Inductor's
    # name for it; the compiled one must not be shadowed by it.
    entry = getattr(cls, "entry_function", None)
    if isinstance(entry, str):
        sys.modules.pop(f"{key}.{entry}", None)
    jit_layer.refuse(installed.rt, installed.key, f"the module did not load: {type(exc).__name__}: {str(exc)[:120]}")
    return installed


# ---- the ISA probes: VecISA.check_build -------------------------------------------------------


def _wrap_check_build(original: Callable[..., bool]) -> Callable[..., bool]:
    def check_build(self: Any, code: str) -> bool:
        rt = jit_layer.serving_runtime()
        if rt is None:
            return original(self, code)
        scope = _state(rt).isa_scope
        outer = getattr(scope, "probes", None)
        probes: list[tuple[Runtime, str, str]] = []
        scope.probes = probes
        try:
            ok = original(self, code)
        finally:
            scope.probes = outer
        if ok or not probes:
            return ok
        # The probe kcache wrote did not load: take it back and let Inductor check with its own.
        with guard("could not take back an ISA probe kcache wrote"):
            for rt, key, path in probes:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                jit_layer.refuse(rt, key, "the ISA probe did not load")
        return original(self, code)

    return check_build


def _wrap_build(original: Callable[..., Any], codecache: ModuleType) -> Callable[..., Any]:
    def build(self: Any) -> Any:
        rt = jit_layer.serving_runtime()
        probes = getattr(_state(rt).isa_scope, "probes", None) if rt is not None else None
        if rt is None or probes is None or os.path.exists(str(self.get_target_file_path())):
            return original(self)  # not a probe, kcache off, or torch rebuilding on purpose
        served, key = False, None
        with guard("Inductor ISA probe lookup failed; Inductor compiles it"):
            served, key = _serve(rt, codecache, None, (self,))  # check_build holds its own lock
            if served and key is not None:
                probes.append((rt, key.key, str(self.get_target_file_path())))
        if served:
            return None
        started = time.perf_counter()
        result = original(self)
        with guard("could not upload an Inductor ISA probe"):
            _upload(rt, key, str(self.get_target_file_path()), time.perf_counter() - started)
        return result

    return build


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "inductor-cpp"
STORES = (jit_layer.LAYER,)


def selected(config: ClientConfig) -> bool:
    return jit_layer.LAYER in selected_layers(config.layers)


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install()
