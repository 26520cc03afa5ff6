"""Dynamo's precompile cache served by kcache: the ``dynamo`` layer.

With ``torch._dynamo.config.caching_precompile`` on (``TORCH_CACHING_PRECOMPILE=1``, the user's
opt-in: it drops ID_MATCH, CLOSURE_MATCH, WEAKREF_ALIVE and DICT_VERSION guards), torch keeps a
``CompilePackage`` per compiled function: Dynamo's bytecode and guards plus the AOTAutograd/
Inductor artifacts of every graph. A process that finds one in ``DynamoCache`` (torch 2.13+:
``DiskDynamoCache``, ``<inductor cache dir>/dynamo/<source id>/entry``) skips Dynamo tracing and
the FX-graph lookups altogether. torch writes packages there only when the user calls
``torch.compiler.save_cache_artifacts()``.

kcache serves that cache fleet-wide:

* **lookup**: ``DiskDynamoCache.load(fn)`` is wrapped; on a local miss the entry is asked of
  kcache (local tier, a promised prefetch, then the service: :meth:`Runtime.get_entry`) and
  written where torch reads it, then torch's own ``load`` runs as it always does.
* **store**: ``DiskDynamoCache._write_to_local_cache(pickled, source_id)`` is wrapped: every
  package torch writes (the user's ``save_cache_artifacts()`` or kcache's save at exit) is also
  uploaded (:meth:`Runtime.put_entry`: signed if signing is on, recorded in the workload).
* **save at exit**: at :meth:`Runtime.close` (interpreter exit, ``uninstall()``), packages this
  process compiled and did not save are written through torch's
  ``PrecompileContext.save_to_dynamo_cache()``, as ``save_cache_artifacts()`` would. At exit
  because a package is complete only then: a training graph's backward is compiled at the first
  ``backward()``, a graph break's resume functions and a recompile's guards come later, and the
  service's entries are write-once (the first upload of a key stands). A process killed without
  exit handlers uploads nothing of this layer.
* **only complete packages**: a package with a code torch marked ``bypassed`` (a graph whose
  AOTAutograd entry torch could not serialize: "Backend not found") is neither uploaded nor, when
  kcache is the one saving, written: torch 2.11 traces such a code again on load and fails
  (``assert name not in scope`` in ``install_global``), where without the package it compiles.
* **only packages torch can load**: torch itself can fail to load a package it wrote (torch
  2.11, a transformers BERT: ``TypeError: DefaultsSource.__init__() ...`` unpickling a guard
  state), and torch catches only ``RuntimeError`` there, so the job dies. kcache saves packages
  for everyone, so that failure is kcache's: the producer unpickles every guard state before it
  uploads a package (one that fails is not uploaded, counted ``unloadable``); the consumer does
  the same to a fetched package before torch sees it, and hands torch the unpickled package and
  states (wrapped ``DiskDynamoCache.read`` and ``load_guards_state``), so the check costs no
  second unpickle. If torch still raises
  while initializing or installing a package kcache supplied, the wrapper around
  ``torch.compile`` resets the package and runs torch again, which then compiles as on a miss.
  Either way the entry leaves torch's dir and kcache's local tier and is quarantined on the
  service (:meth:`Runtime.quarantine`), with one warning. A user's own package stays torch's.
  And a package that loaded must not make torch raise later: Dynamo tracing the function
  again after any package was installed (a guard that fails on this node) named a global the
  package had installed (torch 2.13: ``Name '__builtins_dict___1' already exists in scope``, the
  job dies), so after torch's ``install`` kcache moves Dynamo's name counter past the package's.
* **only packages that pay** (:mod:`kcache.layers.dynamo.payoff`): the producer records with each
  package the seconds its compiles took (Dynamo, AOTAutograd and Inductor of the package's
  frames, lazy backward compiles included; stored in :mod:`kcache.layers.dynamo.package_envelope`' envelope and
  as the entry's compile time). A consumer times ``torch.compile``'s wrapping with the package
  kcache supplied (lookup, fetch, unpickle, check, write, torch's initialize and install),
  notes which of the package's frames it served (a one-shot probe on each compiled graph torch
  installed from it) and watches whether Dynamo traces a frame afterwards. The rule: a package
  **does not pay if Dynamo traced one of its frames again before the package served it** here
  (a guard that fails on this node: the work it was to skip is done anyway, on top of the load),
  **or if loading it took at least as long as compiling it took its producer**. A frame traced
  after the package served it (a later call with new shapes, ``model.eval()``) is work a node
  does with or without the package: no verdict. Such a package leaves torch's dir and the local
  tier and is quarantined on the service with the reason ``does not pay: ...`` (reported off
  the compile thread, waited for at exit), so no other node fetches it, no producer uploads the
  key again and no node's save at exit writes it; the consumer that found out keeps what it
  installed (it has paid already) and says so once (finding ``unprofitable``). Why these two:
  the consumer can only know the load cost by paying it, so the verdict is for the next node;
  a retrace is a loss whatever the numbers; and the producer's compile time is what the issue's
  fresh node would otherwise spend (a node whose FX-graph and AOTAutograd entries kcache serves
  spends less, so the load rule errs on the side of serving).

**Keys.** torch's source id is ``sha256(qualname, first line)``: ``Net.forward`` at line 12 of
two projects collide, and torch relies on its source checks at load time. The service key adds
what must match for a package to be right on another machine, none of it a path, host or rank:
the environment fingerprint (torch, triton, CUDA/HIP, GPU arch) and torch's own
``SystemInfo`` (Python, GPU name: what torch refuses a package for), the function's module,
name, line and bytecode, the contents of the source files of the function and of every module
class in an ``nn.Module``'s tree (an edit anywhere there is a new key: with write-once entries a
stale package could otherwise never be replaced), the tree's parameter and buffer shapes, the
``torch.compile`` backend and its options (mode), and Dynamo's, AOTAutograd's and Inductor's
portable configs (absolute paths left out).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import os
import pickle
import re
import shutil
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kcache_schemas import wire

from kcache.config import ClientConfig, selected_layers
from kcache.current import get_runtime
from kcache.host import patching
from kcache.host.after_import import call_after_import, imported
from kcache.host.failopen import guard, warn_once
from kcache.layers.dynamo import package_envelope as dynamo_entries
from kcache.layers.dynamo import payoff as dynamo_payoff
from kcache.runtime import Runtime
from kcache.store import fingerprint

log = logging.getLogger("kcache.layers.dynamo.packages")

LAYER = wire.CacheLayer.DYNAMO.value
PATCHES = "dynamo-cache"
PACKAGE_MODULE = "torch._dynamo.package"
EVAL_FRAME_MODULE = "torch._dynamo.eval_frame"
BYTECODE_MODULE = "torch._dynamo.bytecode_transformation"
# A global Dynamo named with its unique_id counter (``__builtins_dict___1``, ``__resume_at_30_2``).
_NUMBERED_GLOBAL = re.compile(r"^__\w*_(\d+)$")
KEY_PREFIX = "pt2-precompile-v2:"  # v2: stored in kcache.layers.dynamo.package_envelope' envelope

# torch's own guard loader, on kcache's hook of it: fetched packages are checked with torch's.
_ORIGINAL = "_kcache_original"


@dataclass
class Served:
    """What the layer learned serving one runtime (:meth:`Runtime.layer_state`): a reinstalled
    kcache, or one installed with other options, starts with none of it, as a fresh process
    does (a package fetched from the last runtime's service is not the new one's)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    service_keys: dict[str, str | None] = field(default_factory=dict)  # torch's source id -> service key (None: ambiguous)
    from_service: set[str] = field(default_factory=set)  # source ids fetched from kcache: already stored there
    handed_over: set[str] = field(default_factory=set)  # source ids this runtime uploaded
    incomplete: set[str] = field(default_factory=set)  # source ids whose last package torch wrote had a bypassed code
    refused: set[str] = field(default_factory=set)  # source ids whose kcache package torch could not load: not fetched again
    # Guard states kcache unpickled while checking a fetched package, by their pickled bytes:
    # torch's install gets these objects instead of unpickling the same bytes a second time.
    preloaded: dict[bytes, Any] = field(default_factory=dict)
    # The package entries themselves, by torch's source id: torch's read of the file kcache wrote
    # gets the object already unpickled (its backends run to hundreds of MB).
    preloaded_entries: dict[str, Any] = field(default_factory=dict)
    reports: list[threading.Thread] = field(default_factory=list)  # verdicts sent off the compile thread; joined at close
    compiling: threading.local = field(default_factory=threading.local)  # .backend: the torch.compile backend being wrapped
    saving: threading.local = field(default_factory=threading.local)  # .active: kcache's save at exit is writing


def _state(rt: Runtime | None) -> Served:
    """``rt``'s state of this layer (a throwaway where no runtime runs: nothing is kept)."""
    return rt.layer_state(Served) if rt is not None else Served()


def _serving(rt: Runtime | None) -> bool:
    """Whether this layer serves ``rt``: a hook that fires after ``uninstall()`` (torch imported
    its module later) or under a runtime that did not select the layer does nothing."""
    return rt is not None and selected(rt.config)


def install() -> None:
    """Serve the layer once torch's precompile modules have loaded (kcache installs while torch
    may still be importing them)."""
    rt = get_runtime()
    if rt is not None:  # activation made it first
        rt.at_close("save Dynamo's precompile packages", save_pending)
        rt.at_close("report Dynamo packages that did not pay", finish_reports)
    call_after_import(EVAL_FRAME_MODULE, _hook_eval_frame)
    call_after_import(PACKAGE_MODULE, _hook_package)


def uninstall() -> None:
    """Hand over what this process compiled (through the hooks, still in place), then unhook."""
    with guard("could not save Dynamo's precompile packages"):
        save_pending()
    with guard("could not report Dynamo packages that did not pay"):
        finish_reports()
    patching.restore(PATCHES)
    dynamo_payoff.uninstall()
    state = _state(get_runtime())
    with state.lock:
        state.preloaded.clear()
        state.preloaded_entries.clear()


def _precompile_on() -> bool:
    config = imported("torch._dynamo.config")
    return bool(getattr(config, "caching_precompile", False))


# ---- hooks ---------------------------------------------------------------------------------------


def _original(hooked: Any) -> Any:
    """torch's own function behind a hook of this layer (or ``hooked`` itself: not hooked)."""
    return getattr(hooked, _ORIGINAL, hooked)


def _hook_package(module: types.ModuleType) -> None:
    with guard("could not hook Dynamo's precompile cache; layer dynamo not served"):
        cls = getattr(module, "DiskDynamoCache", None)
        load = patching.current(cls, "load") if isinstance(cls, type) else None
        write = getattr(cls, "_write_to_local_cache", None)
        if not _serving(get_runtime()) or getattr(load, "__wrapped__", None) is not None:
            return  # uninstalled before the module loaded, or hooked already
        source_id = getattr(getattr(module, "CompilePackage", None), "source_id_from_fn", None)
        if not (callable(load) and callable(write) and callable(getattr(cls, "path_prefix", None)) and callable(source_id)):
            # torch 2.9-2.12: packages are written only by PrecompileContext.populate_caches
            # (load_cache_artifacts), as two pickles, and DynamoCache.load returns a tuple.
            if _precompile_on():
                warn_once(
                    "this torch's DynamoCache has no DiskDynamoCache.load/_write_to_local_cache/path_prefix; layer dynamo "
                    "not served (Dynamo traces as without kcache; the other layers still serve)"
                )
            return
        # Fetched packages are written with torch's own store, unhooked: the service has them.
        patching.patch(PATCHES, cls, "load", _wrap_load(module, load, write))
        patching.patch(PATCHES, cls, "_write_to_local_cache", _wrap_write(write))
        store = getattr(cls, "write", None)
        if callable(store):
            patching.patch(PATCHES, cls, "write", _wrap_store(store))
        load_guards = getattr(module, "load_guards_state", None)
        if callable(load_guards):  # CompilePackage.install calls it through the module's globals
            patching.patch(PATCHES, module, "load_guards_state", _wrap_load_guards(load_guards))
        read = getattr(cls, "read", None)
        if callable(read):  # load_cache_entry(key) -> self.read(key)
            patching.patch(PATCHES, cls, "read", _wrap_read(read))
        package_cls = getattr(module, "CompilePackage", None)
        install_package = patching.current(package_cls, "install") if isinstance(package_cls, type) else None
        if callable(install_package):
            patching.patch(PATCHES, package_cls, "install", _wrap_install(install_package))
        dynamo_payoff.install(module, _not_paying)


def _hook_eval_frame(module: types.ModuleType) -> None:
    with guard("could not learn torch.compile's backend for Dynamo's precompile keys; layer dynamo not served"):
        ctx = getattr(module, "_TorchDynamoContext", None)
        original = patching.current(ctx, "__call__") if isinstance(ctx, type) else None
        if not _serving(get_runtime()) or not callable(original) or getattr(original, "__wrapped__", None) is not None:
            return

        @functools.wraps(original)
        def __call__(self: Any, fn: Any) -> Any:
            state = _state(get_runtime())
            compiling = state.compiling
            previous = getattr(compiling, "backend", None)
            compiling.backend = getattr(self, "callback", None)
            # torch.compile(module) calls this again for the module's forward, inside: the
            # outermost call loads the package and is the one judged.
            depth = getattr(compiling, "depth", 0)
            compiling.depth = depth + 1
            outermost = depth == 0
            started = time.perf_counter()
            try:
                try:
                    if outermost:
                        dynamo_payoff.forget_loaded()
                    wrapped = original(self, fn)  # torch's, unguarded
                    if outermost:
                        with guard("could not judge a Dynamo package kcache supplied"):
                            dynamo_payoff.installed(getattr(self, "_package", None), time.perf_counter() - started, _not_paying)
                    return wrapped
                except Exception as exc:
                    recovered = False
                    with guard("could not recover from a Dynamo package torch failed to load"):
                        recovered = _recover(self, fn, exc)
                    if not recovered:
                        raise  # not a package kcache supplied, or no way back: torch's own behaviour
                return original(self, fn)  # torch again: a miss now, so Dynamo compiles
            finally:
                compiling.backend = previous
                compiling.depth = depth
                with state.lock:  # what torch did not ask for (it loaded nothing, or failed first)
                    state.preloaded.clear()
                    state.preloaded_entries.clear()

        patching.patch(PATCHES, ctx, "__call__", __call__)


def _wrap_load(module: types.ModuleType, original: Callable[..., Any], write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        fetched: dynamo_payoff.Supplied | None = None
        with guard("dynamo lookup failed"):
            fetched = _fetch(module, self, fn, write)
        result = original(self, fn, *args, **kwargs)  # torch's, unguarded
        if fetched is not None and result is not None:
            dynamo_payoff.loaded(fetched)  # judged once torch.compile's wrapping installed it
        if fetched is not None and result is None:
            with guard("dynamo lookup failed"):
                # torch could not read what kcache wrote (it counted dynamo_cache_error, said why
                # and compiles): out of its dir, and out of service.
                source_id = str(module.CompilePackage.source_id_from_fn(fn))
                rt = get_runtime()
                state = _state(rt)
                with state.lock:
                    state.from_service.discard(source_id)
                    state.refused.add(source_id)
                    key = state.service_keys.get(source_id)
                shutil.rmtree(os.path.join(self.path_prefix(), source_id), ignore_errors=True)
                if rt is not None and key is not None:
                    rt.quarantine(LAYER, key, "torch could not read the package (DynamoCache.load)")
        return result

    return load


def _wrap_write(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def write(self: Any, pickled_content: bytes, path: str, *args: Any, **kwargs: Any) -> Any:
        result = original(self, pickled_content, path, *args, **kwargs)  # torch's, unguarded
        with guard("dynamo store failed"):
            _upload(path, pickled_content)
        return result

    return write


def _wrap_store(original: Callable[..., Any]) -> Callable[..., Any]:
    """``write(cache_entry, path)``: note whether the package is complete before torch pickles it."""

    @functools.wraps(original)
    def write(self: Any, cache_entry: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        complete = True
        state = _state(get_runtime())
        with guard("dynamo store failed"):
            complete = _complete(cache_entry)
            with state.lock:
                if complete:
                    state.incomplete.discard(str(path))
                else:
                    state.incomplete.add(str(path))
        if getattr(state.saving, "active", False) and (not complete or _refused_by_service(str(path))):
            # kcache's own save: do not leave torch a package it cannot load, nor one the
            # fleet found unloadable or not paying (the next process of this node would load it)
            return None
        return original(self, cache_entry, path, *args, **kwargs)  # torch's, unguarded

    return write


def _wrap_install(original: Callable[..., Any]) -> Callable[..., Any]:
    """``CompilePackage.install``: then keep the names Dynamo makes from colliding with the
    package's (see :func:`_past_package_names`)."""

    @functools.wraps(original)
    def install(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)  # torch's, unguarded
        with guard("could not keep Dynamo's global names apart from a package's"):
            _past_package_names(self)
        return result

    return install


def _past_package_names(package: Any) -> None:
    """A package installs globals named in its producer's process (``__builtins_dict___1``: a
    number from Dynamo's ``unique_id`` counter there). In a process that loaded it, the counter
    starts again, so when Dynamo traces the function again (a guard that fails on this node), it
    names a global the package already installed and torch raises ``AssertionError: Name
    '__builtins_dict___1' already exists in scope`` (torch 2.13, CPU): the job dies. The counter
    only has to hand out unique names, so it is moved past every numbered global of the
    package's modules."""
    codes = getattr(package, "_codes", None)
    modules = {sys.modules.get(getattr(entry, "python_module", "")) for entry in (codes or {}).values()}
    top = -1
    for module in modules:
        for name in list(getattr(module, "__dict__", {})):
            match = _NUMBERED_GLOBAL.match(name)
            if match is not None:
                top = max(top, int(match.group(1)))
    transformation = imported(BYTECODE_MODULE)
    counter = getattr(transformation, "_unique_id_counter", None)
    if top < 0 or not isinstance(counter, itertools.count):
        return
    upcoming = next(counter)  # not handed out: the new counter starts at it (or past the package's)
    transformation._unique_id_counter = itertools.count(max(upcoming, top + 1))  # type: ignore[union-attr]


def _refused_by_service(source_id: str) -> bool:
    rt = get_runtime()
    state = _state(rt)
    with state.lock:
        key = state.service_keys.get(source_id)
    return rt is not None and key is not None and (LAYER, key) in rt.quarantined


def _wrap_load_guards(original: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    @functools.wraps(original)
    def load_guards_state(guards_state: bytes) -> Any:
        state = None
        with guard("dynamo lookup failed"):
            served = _state(get_runtime())
            with served.lock:
                state = served.preloaded.pop(guards_state, None) if served.preloaded else None
        return state if state is not None else original(guards_state)  # torch's, unguarded

    setattr(load_guards_state, _ORIGINAL, original)  # unloadable checks with torch's own
    return load_guards_state


def _wrap_read(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def read(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        entry = None
        with guard("dynamo lookup failed"):
            served = _state(get_runtime())
            with served.lock:
                entry = served.preloaded_entries.pop(path, None) if served.preloaded_entries else None
        return entry if entry is not None else original(self, path, *args, **kwargs)  # torch's, unguarded

    return read


def _recover(ctx: Any, fn: Any, exc: Exception) -> bool:
    """torch raised while initializing or installing the package kcache fetched for ``fn``:
    quarantine it, put the context's package back to its fresh state (the compile callback
    holds the same object) and tell the wrapper to run torch again. False where the package
    was not kcache's, the error came from elsewhere, or this torch lacks the pieces."""
    package_module = imported(PACKAGE_MODULE)
    package: Any = getattr(ctx, "_package", None)
    cls: Any = getattr(package_module, "CompilePackage", None)
    if package is None or not _instance_of(package, cls) or not _precompile_on():
        return False
    if not _raised_loading(exc, cls):
        return False
    nn = imported("torch.nn")
    fn_key = fn.forward if nn is not None and isinstance(fn, nn.Module) else fn  # what torch loads for
    source_id = str(cls.source_id_from_fn(fn_key))
    rt = get_runtime()
    state = _state(rt)
    with state.lock:
        if source_id not in state.from_service:
            return False  # the user's own package: torch's behaviour stands
        state.from_service.discard(source_id)
        state.refused.add(source_id)
        key = state.service_keys.get(source_id)
    store = getattr(package_module, "DynamoCache", None)
    prefix = getattr(store, "path_prefix", None)
    if callable(prefix):
        shutil.rmtree(os.path.join(prefix(), source_id), ignore_errors=True)  # the copy kcache wrote
    if getattr(package, "_innermost_fn", None) is not None:
        with guard("could not uninstall a Dynamo package torch failed to load"):
            package.uninstall()  # globals it installed before failing
    cls.__init__(package, None)  # empty and uninitialized, as torch.compile made it
    if rt is not None and key is not None:
        rt.quarantine(LAYER, key, f"{type(exc).__name__}: {exc}"[:512])
    return True


def _instance_of(obj: Any, cls: Any) -> bool:
    return isinstance(cls, type) and isinstance(obj, cls)


def _raised_loading(exc: BaseException, cls: type) -> bool:
    """Did ``exc`` come out of ``CompilePackage.initialize`` or ``install`` (loading a package),
    rather than from anything else ``torch.compile`` does?"""
    codes = {getattr(getattr(cls, name, None), "__code__", None) for name in ("initialize", "install")}
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    context = exc.__context__  # torch's own except-branch failing in turn (initialize again)
    return context is not None and context is not exc and _raised_loading(context, cls)


def unloadable(module: types.ModuleType, data: bytes, *, keep_for: str | None = None) -> str | None:
    """Why torch could not load package ``data``, or None: unpickled as torch's
    ``DiskDynamoStore.read`` does, then every guard state through torch's own
    ``load_guards_state`` (what ``CompilePackage.install`` does; a bypassed code installs no
    guards). ``keep_for``: the source id torch will read the package for; the unpickled entry
    and states are handed to torch's read and install, which then unpickle nothing twice."""
    load = _original(getattr(module, "load_guards_state", None)) or pickle.loads
    guards = imported("torch._dynamo.guards")
    state_cls = getattr(guards, "GuardsState", None)
    loaded: dict[bytes, Any] = {}
    try:
        entry = pickle.loads(data)
        for code in entry.dynamo.codes:
            if getattr(code, "bypassed", False):
                continue
            for guarded in code.guarded_codes:
                state = load(guarded.guards_state)
                if isinstance(state_cls, type) and not isinstance(state, state_cls):
                    return f"a guard state unpickles to {type(state).__name__}, not GuardsState"
                loaded[guarded.guards_state] = state
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:512]
    if keep_for is not None:
        state = _state(get_runtime())
        with state.lock:
            state.preloaded.update(loaded)
            state.preloaded_entries[keep_for] = entry
    return None


def _complete(cache_entry: Any) -> bool:
    """False if torch bypassed a code of the package (a backend it could not serialize)."""
    codes = getattr(getattr(cache_entry, "dynamo", None), "codes", None)
    return not any(getattr(code, "bypassed", False) for code in codes or ())


# ---- lookup and store ----------------------------------------------------------------------------


def _fetch(module: types.ModuleType, store: Any, fn: Any, write: Callable[..., Any]) -> dynamo_payoff.Supplied | None:
    """On a local miss, put kcache's entry where torch's ``load`` reads it; what it put there."""
    rt = get_runtime()
    if rt is None or not _serving(rt):
        return None
    state = _state(rt)
    source_id = str(module.CompilePackage.source_id_from_fn(fn))
    key = service_key(fn)
    with state.lock:
        known = state.service_keys.setdefault(source_id, key)
        if known != key:  # two functions of this process share torch's source id: torch mixes them
            state.service_keys[source_id] = None
            return None
        if source_id in state.refused:
            return None  # torch could not load kcache's package for it, or it did not pay: compile
    if os.path.exists(os.path.join(store.path_prefix(), source_id)):
        return None  # torch's own local entry: torch reads it
    data = rt.get_entry(LAYER, key)
    if data is None:
        return None
    try:
        stored = dynamo_entries.decode(data)
        problem = unloadable(module, stored.package, keep_for=source_id)
    except ValueError as exc:
        stored, problem = None, str(exc)
    if stored is None or problem is not None:  # torch would raise it (only a RuntimeError spares the job)
        with state.lock:
            state.refused.add(source_id)
        rt.quarantine(LAYER, key, problem or "unreadable")
        return None
    write(store, stored.package, source_id)  # torch's atomic write, unhooked: the service has it
    with state.lock:
        state.from_service.add(source_id)
    return dynamo_payoff.Supplied(source_id, key, stored.compile_s)


def _not_paying(supplied: dynamo_payoff.Supplied, reason: str) -> None:
    """A package kcache supplied did not pay here (:mod:`kcache.layers.dynamo.payoff`): this process
    does not fetch it again, the next process of this node does not find it in torch's dir, and
    the service is told (off the compile thread) so that no node receives it again."""
    rt = get_runtime()
    state = _state(rt)
    with state.lock:
        state.refused.add(supplied.source_id)
    package = imported(PACKAGE_MODULE)
    prefix = getattr(getattr(package, "DynamoCache", None), "path_prefix", None)
    if callable(prefix):
        shutil.rmtree(os.path.join(prefix(), supplied.source_id), ignore_errors=True)
    if rt is None:
        return
    report = threading.Thread(target=rt.quarantine, args=(LAYER, supplied.key, reason), kwargs={"unprofitable": True},
                              name="kcache-dynamo-verdict", daemon=True)
    with state.lock:
        state.reports.append(report)
    report.start()


def finish_reports() -> None:
    """Wait (at most the flush timeout) for the reports of packages that did not pay."""
    rt = get_runtime()
    state = _state(rt)
    with state.lock:
        reports, state.reports[:] = list(state.reports), []
    deadline = time.monotonic() + (rt.config.flush_timeout_s if rt is not None else 5.0)
    for report in reports:
        report.join(max(0.0, deadline - time.monotonic()))


def _upload(source_id: str, pickled: bytes) -> None:
    rt = get_runtime()
    if rt is None or not _serving(rt):
        return
    state = _state(rt)
    with state.lock:
        key = state.service_keys.get(source_id)
        if key is None or source_id in state.from_service or source_id in state.incomplete:
            return  # a lookup this runtime did not see, an ambiguous id, the service's own entry, or incomplete
        state.handed_over.add(source_id)
    if (LAYER, key) in rt.quarantined:
        return  # the service refuses it: a node found it unloadable or not paying
    module = imported(PACKAGE_MODULE)
    problem = unloadable(module, pickled) if module is not None else None
    if problem is not None:
        # torch wrote a package it cannot load (torch 2.11: a guard state that does not
        # unpickle); torch's own local copy is the user's, but no other node gets it.
        rt.stats.put_error(LAYER, "unloadable")
        warn_once(f"a Dynamo package torch wrote cannot be loaded ({problem[:200]}); not uploaded")
        return
    compile_s = dynamo_payoff.compile_seconds(source_id)
    rt.put_entry(LAYER, key, dynamo_entries.encode(bytes(pickled), compile_s), compile_s)


def save_pending() -> None:
    """Have torch write the packages this process compiled and did not hand over (what
    ``torch.compiler.save_cache_artifacts()`` does for them), so the store hook uploads them."""
    rt = get_runtime()
    if rt is None or not _serving(rt) or not patching.is_patched(PATCHES):
        return
    context = imported("torch._dynamo.precompile_context")
    if context is None or not _precompile_on():
        return
    ctx = context.PrecompileContext
    entries = getattr(ctx, "_dynamo_cache_entries", None)
    save = getattr(ctx, "save_to_dynamo_cache", None)
    if not isinstance(entries, dict) or not callable(save):
        return
    state = _state(rt)
    with state.lock:
        pending = [s for s in entries if state.service_keys.get(s) and s not in state.from_service
                   and s not in state.handed_over and (LAYER, state.service_keys[s]) not in rt.quarantined]
    if pending:
        state.saving.active = True
        try:
            save()
        finally:
            state.saving.active = False


# ---- the service key -----------------------------------------------------------------------------


def service_key(fn: Any) -> str:
    """A portable, environment-scoped key for the package of ``fn`` (see the module docstring)."""
    target = _innermost(fn)
    owner = getattr(target, "__self__", None)
    code = getattr(target, "__code__", None)
    material = {
        "fingerprint": fingerprint.current().model_dump(),
        "system": _system_info(),
        "function": [getattr(target, "__module__", None), getattr(target, "__qualname__", None),
                     getattr(code, "co_firstlineno", None), _code_digest(code) if code is not None else None],
        "sources": _source_digests(target, owner),
        "tree": _module_tree(owner),
        "backend": _backend_identity(getattr(_state(get_runtime()).compiling, "backend", None)),
        "configs": _configs(),
    }
    blob = json.dumps(_normalize(material)).encode()
    return KEY_PREFIX + hashlib.sha256(blob).hexdigest()


def _innermost(fn: Any) -> Any:
    while hasattr(fn, "_torchdynamo_orig_callable"):  # what torch's innermost_fn unwraps
        fn = fn._torchdynamo_orig_callable
    return fn


def _system_info() -> Any:
    """torch's own ``SystemInfo`` (Python, torch, toolkit, triton, GPU name): a package from
    another one is refused by torch at load time."""
    package = imported(PACKAGE_MODULE)
    info = getattr(package, "SystemInfo", None)
    current = getattr(info, "current", None)
    if not callable(current):
        return None
    value = current()
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else repr(value)


def _code_digest(code: Any) -> str:
    """Bytecode, names and constants, recursively; no file name (a path), no object address."""
    h = hashlib.sha256()
    for attr in ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags", "co_code", "co_names",
                 "co_varnames", "co_freevars", "co_cellvars", "co_qualname"):
        h.update(repr(getattr(code, attr, None)).encode())
    for const in getattr(code, "co_consts", ()):
        h.update(_const_repr(const).encode())
    return h.hexdigest()


def _const_repr(const: Any) -> str:
    if isinstance(const, types.CodeType):
        return "code:" + _code_digest(const)
    if isinstance(const, frozenset):  # iteration order follows string hashing: per process
        return "frozenset:" + ",".join(sorted(_const_repr(c) for c in const))
    if isinstance(const, tuple):
        return "(" + ",".join(_const_repr(c) for c in const) + ")"
    return f"{type(const).__name__}:{const!r}"


@functools.lru_cache(maxsize=256)
def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def _module_file(name: str | None) -> str | None:
    module = sys.modules.get(name or "")
    path = getattr(module, "__file__", None)
    return path if isinstance(path, str) else None


def _source_digests(target: Any, owner: Any) -> list[list[Any]]:
    """Content hashes of the files that define the function and the module tree's classes,
    named by module (never by path)."""
    names = {getattr(target, "__module__", None)}
    names.update(type(m).__module__ for m in _submodules(owner))
    digests = []
    for name in sorted(n for n in names if n):
        path = _module_file(name)
        digests.append([name, _file_digest(path) if path else None])
    return digests


def _submodules(owner: Any) -> Iterator[Any]:
    modules = getattr(owner, "modules", None)
    nn = imported("torch.nn")
    if owner is None or nn is None or not isinstance(owner, nn.Module) or not callable(modules):
        return iter(())
    return iter(modules())


def _module_tree(owner: Any) -> list[Any] | None:
    """An ``nn.Module``'s structure: classes, training flags, parameter and buffer shapes."""
    nn = imported("torch.nn")
    if owner is None or nn is None or not isinstance(owner, nn.Module):
        return None
    tree: list[Any] = [[name, type(m).__module__, type(m).__qualname__, bool(m.training)] for name, m in owner.named_modules()]
    for name, t in [*owner.named_parameters(), *owner.named_buffers()]:
        tree.append([name, list(t.shape), str(t.dtype), t.device.type, bool(t.requires_grad)])
    return tree


def _backend_identity(callback: Any) -> list[Any] | None:
    """The ``torch.compile`` backend behind Dynamo's callback, with its options (``mode`` lands
    in the Inductor wrapper's ``config``), never an object address."""
    if callback is None:
        return None
    backend = callback
    while hasattr(backend, "_torchdynamo_orig_backend"):  # torch's innermost_backend
        backend = backend._torchdynamo_orig_backend
    config = getattr(backend, "config", None)
    return [
        type(backend).__module__, type(backend).__qualname__, getattr(backend, "__qualname__", None),
        getattr(backend, "compiler_name", None),
        {str(k): v for k, v in config.items()} if isinstance(config, dict) else None,
        repr(getattr(backend, "dynamic", None)),
    ]


def _configs() -> dict[str, Any]:
    """Dynamo's, AOTAutograd's and Inductor's portable configs (what their own cache keys hash),
    without absolute paths (Dynamo's ``base_dir``, ``debug_dir_root``: per machine)."""
    out: dict[str, Any] = {}
    for name in ("torch._dynamo.config", "torch._functorch.config", "torch._inductor.config"):
        portable = getattr(imported(name), "save_config_portable", None)
        if not callable(portable):
            out[name] = None
            continue
        items = portable()
        out[name] = {str(k): v for k, v in items.items() if not (isinstance(v, str) and os.path.isabs(v))}
    return out


def _normalize(value: Any) -> Any:
    """A JSON-able form that is the same in every process: dicts as sorted pairs, sets sorted (a
    set of strings iterates in a per-process order), anything else JSON cannot spell as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return sorted(([str(k), _normalize(v)] for k, v in value.items()), key=lambda kv: kv[0])
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(json.dumps(_normalize(v)) for v in value)
    return repr(value)


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "dynamo"
STORES = (LAYER,)


def selected(config: ClientConfig) -> bool:
    return LAYER in selected_layers(config.layers)


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install()
