"""Whether a Dynamo package kcache supplied paid: the ``dynamo`` layer's serving rule.

A package saves a node Dynamo's tracing of a function and the AOTAutograd and Inductor compiles
of its graphs; loading it costs the fetch, unpickling, kcache's check, torch's write into its
dir, and torch's initialize and install (the backends' deserialization included), all at
``torch.compile`` wrapping. On an H100 a transformers Llama train step's package cost 1.9 s to load
and then Dynamo traced the function again (2.2 s): that node was slower than one without it.

**Measured per package**, by torch's source id:

* on the producer, the seconds its compiles took (``compile_s``): every Dynamo frame compile of
  the package's codes (torch's ``CompilePackage.code_context`` spans one frame's Dynamo tracing,
  AOTAutograd and Inductor) plus the lazy backward compile of each of their graphs (torch's
  compile callbacks, trigger ``LAZY_BACKWARD``, keyed by the forward's compile id). It travels
  with the package (:mod:`kcache.layers.dynamo.package_envelope`).
* on a consumer, the seconds ``torch.compile``'s wrapping of the function took with the package
  kcache supplied (``load_s``: lookup, fetch, unpickle, check, write, initialize, install);
  which of the package's frames it served (a probe on each compiled graph torch installed from
  it notes the graph's first run, then puts torch's own graph back); and whether Dynamo then
  traced a frame the package had not served yet (its guards failed on this node: the work the
  package was to skip is done anyway).

**The rule**: a package does not pay, and is served to no other node, when Dynamo traced one of
its frames after kcache installed it and before the package served that frame here (for a
frame without a graph, or one the package lacks: before it served any), or when
``load_s >= compile_s``. A package whose producer measured nothing is judged by the retrace
alone. A frame traced again after the package served it (a later call with new shapes, or
``model.eval()``) is new work the node would do without the package too: not a verdict (one
node's later shapes must not take a package that served its first call out of the fleet).

The consumer that finds it out has paid already; what it does is the quarantine machinery's
(:meth:`Runtime.quarantine` with ``unprofitable``): out of its local tier and torch's dir,
reported to the service (reason ``does not pay: ...``), which then answers every node
``quarantined`` and refuses the key's uploads, so producers stop re-uploading it and no node
saves it at exit.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kcache.current import get_runtime
from kcache.host import patching
from kcache.host.after_import import imported
from kcache.host.failopen import guard

PATCHES = "dynamo-payoff"
CALLBACK_MODULE = "torch._dynamo.callback"
_BACKWARD = "LAZY_BACKWARD"  # torch's CallbackTrigger for a graph's lazy backward compile


@dataclass(frozen=True)
class Supplied:
    """A package kcache handed torch for one function."""

    source_id: str
    key: str  # the service key
    compile_s: float | None  # its producer's compile seconds, if measured


# Called with (supplied, reason) when a supplied package did not pay (set by kcache.layers.dynamo.packages).
Verdict = Callable[[Supplied, str], None]


@dataclass
class Watch:
    """An installed package kcache supplied: what it serves on this node. Holds no reference to
    the package (the probes in the modules' globals hold this; the package must stay collectable)."""

    supplied: Supplied
    load_s: float
    with_graphs: frozenset[Any]  # the package's codes that have compiled graphs
    served: set[Any] = field(default_factory=set)  # codes whose graphs ran here (set.add: atomic)

    def has_served(self, code: Any) -> bool:
        """Did the package serve ``code`` here (for a code without graphs of its own: anything)?"""
        return code in self.served if code in self.with_graphs else bool(self.served)


@dataclass
class Measured:
    """What the payoff rule measured in one runtime (:meth:`Runtime.layer_state`): a reinstalled
    kcache starts with none of it, as a fresh process does."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    compile_s: dict[str, float] = field(default_factory=dict)  # source id -> seconds its compiles took
    by_compile_id: dict[str, str] = field(default_factory=dict)  # torch's compile id -> source id compiling
    backward_started: dict[str, float] = field(default_factory=dict)  # compile id -> its lazy backward's start
    # Packages kcache supplied and torch installed, until Dynamo traces a frame they had not served.
    watched: weakref.WeakKeyDictionary[Any, Watch] = field(default_factory=weakref.WeakKeyDictionary)
    pending: threading.local = field(default_factory=threading.local)  # .supplied: what torch's load returned


def _measured() -> Measured:
    """The current runtime's measurements (a throwaway where none runs: nothing is kept)."""
    rt = get_runtime()
    return rt.layer_state(Measured) if rt is not None else Measured()


def install(module: types.ModuleType, on_verdict: Verdict) -> None:
    """Time and watch ``CompilePackage.code_context`` of ``torch._dynamo.package``; a package
    found not paying goes to ``on_verdict``."""
    cls = getattr(module, "CompilePackage", None)
    original = patching.current(cls, "code_context") if isinstance(cls, type) else None
    if not callable(original) or getattr(original, "_kcache_payoff", False):
        return  # not this torch's, or wrapped already (torch's own is a contextmanager: it has __wrapped__)
    patching.patch(PATCHES, cls, "code_context", _wrap_code_context(original, on_verdict))


def uninstall() -> None:
    patching.restore(PATCHES)
    handler = getattr(imported(CALLBACK_MODULE), "callback_handler", None)
    for name, callback in (("start_callbacks", _on_start), ("end_callbacks", _on_end)):
        callbacks = getattr(handler, name, None)
        if isinstance(callbacks, list) and callback in callbacks:
            callbacks.remove(callback)
    state = _measured()
    with state.lock:
        state.compile_s.clear()
        state.by_compile_id.clear()
        state.backward_started.clear()
        state.watched.clear()


def judge(load_s: float, compile_s: float | None) -> str | None:
    """Why loading a package that took ``load_s`` does not pay, or None."""
    if compile_s is not None and load_s >= compile_s:
        return f"loading it took {load_s:.2f}s, compiling it took its producer {compile_s:.2f}s"
    return None


def compile_seconds(source_id: str) -> float | None:
    """What compiling the package of ``source_id`` took this process, if it compiled any of it."""
    state = _measured()
    with state.lock:
        return state.compile_s.get(source_id)


# ---- consumer ------------------------------------------------------------------------------------


def loaded(supplied: Supplied) -> None:
    """torch's ``DynamoCache.load`` returned the package kcache supplied (this thread)."""
    _measured().pending.supplied = supplied


def forget_loaded() -> None:
    _measured().pending.supplied = None


def installed(package: Any, load_s: float, on_verdict: Verdict) -> None:
    """``torch.compile``'s wrapping returned after ``load_s`` seconds: judge the package torch
    loaded in it (if kcache supplied one and torch installed it), then watch it for a retrace."""
    state = _measured()
    supplied: Supplied | None = getattr(state.pending, "supplied", None)
    state.pending.supplied = None
    if supplied is None or package is None or not _installed(package):
        return  # no package of kcache's, or torch could not use it and compiles (a miss)
    reason = judge(load_s, supplied.compile_s)
    if reason is not None:
        on_verdict(supplied, reason)
        return
    codes: dict[Any, Any] = package._codes
    watch = Watch(supplied, load_s, frozenset(code for code, entry in codes.items() if getattr(entry, "backend_ids", None)))
    with state.lock:
        state.watched[package] = watch
    _probe_graphs(codes, watch)


def _probe_graphs(codes: dict[Any, Any], watch: Watch) -> None:
    """Replace each compiled graph torch installed from the package (a global the frame's
    bytecode loads by name at every run) with a probe that notes the frame served and puts
    torch's own graph back at its first run. Without torch's ``disable`` (Dynamo must not trace
    the probe) nothing is probed: every retrace then counts, as if nothing had been served."""
    disable = getattr(imported("torch._dynamo"), "disable", None)
    if not callable(disable):
        return
    for code, entry in codes.items():
        module = sys.modules.get(str(getattr(entry, "python_module", "")))
        for backend_id in getattr(entry, "backend_ids", None) or ():
            scope = getattr(module, "__dict__", None)
            if isinstance(scope, dict) and callable(scope.get(backend_id)):
                scope[backend_id] = _probe(scope, str(backend_id), scope[backend_id], watch, code, disable)


def _probe(scope: dict[str, Any], name: str, graph: Callable[..., Any], watch: Watch, code: Any,
           disable: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[..., Any]:
    def served(*args: Any, **kwargs: Any) -> Any:
        if scope.get(name) is probe:
            scope[name] = graph  # once is enough: later runs call torch's graph directly
        watch.served.add(code)
        return graph(*args, **kwargs)

    probe = disable(served)
    return probe


def _installed(package: Any) -> bool:
    """Did torch install guarded code from the package (rather than start a fresh one)?"""
    codes = getattr(package, "_codes", None)
    return isinstance(codes, dict) and any(getattr(entry, "guarded_codes", None) for entry in codes.values())


# ---- producer (and the consumer's retrace) -------------------------------------------------------


def _wrap_code_context(original: Callable[..., Any], on_verdict: Verdict) -> Callable[..., Any]:
    @functools.wraps(original)
    def code_context(self: Any, code: Any) -> Any:
        return _FrameCompile(original(self, code), self, code, on_verdict)  # torch's, unguarded

    code_context._kcache_payoff = True  # type: ignore[attr-defined]
    return code_context


class _FrameCompile:
    """torch's ``code_context`` of one frame compile, entered by Dynamo's ``_compile`` inside the
    frame's compile context: timed for the package's producer record, and the end of a supplied
    package's watch."""

    def __init__(self, inner: Any, package: Any, code: Any, on_verdict: Verdict) -> None:
        self._inner, self._package, self._code, self._on_verdict = inner, package, code, on_verdict
        self._started: float | None = None

    def __enter__(self) -> Any:
        with guard("could not time a Dynamo frame compile for its package"):
            self._started = _frame_started(self._package, self._code, self._on_verdict)
        return self._inner.__enter__()

    def __exit__(self, *exc_info: Any) -> Any:
        try:
            return self._inner.__exit__(*exc_info)
        finally:
            with guard("could not time a Dynamo frame compile for its package"):
                if self._started is not None:
                    _add(str(self._package.source_id), time.perf_counter() - self._started)


def _frame_started(package: Any, code: Any, on_verdict: Verdict) -> float:
    source_id = str(package.source_id)
    compile_id = _current_compile_id()
    state = _measured()
    with state.lock:
        if compile_id is not None:
            state.by_compile_id[compile_id] = source_id
        watch = state.watched.get(package)
        if watch is not None and not watch.has_served(code):
            state.watched.pop(package, None)
        else:
            watch = None  # not kcache's, judged already, or a frame it served: new work, not the package's
    _ensure_callbacks()
    if watch is not None:
        name = getattr(code, "co_name", "?")
        on_verdict(watch.supplied, f"Dynamo traced {name} again after kcache installed it, before it served that frame "
                                   f"(its guards failed on this node), on top of {watch.load_s:.2f}s loading it")
    return time.perf_counter()


def _add(source_id: str, seconds: float) -> None:
    state = _measured()
    with state.lock:
        state.compile_s[source_id] = state.compile_s.get(source_id, 0.0) + seconds


def _current_compile_id() -> str | None:
    context = getattr(imported("torch._guards"), "CompileContext", None)
    current = getattr(context, "current_compile_id", None)
    compile_id = current() if callable(current) else None
    return str(compile_id) if compile_id is not None else None


def _ensure_callbacks() -> None:
    """torch's compile callbacks time each lazy backward compile; ``torch._dynamo.reset()``
    clears them, so they are checked at every frame compile."""
    handler = getattr(imported(CALLBACK_MODULE), "callback_handler", None)
    for name, register, callback in (("start_callbacks", "register_start_callback", _on_start),
                                     ("end_callbacks", "register_end_callback", _on_end)):
        callbacks = getattr(handler, name, None)
        if isinstance(callbacks, list) and callback not in callbacks and callable(getattr(handler, register, None)):
            getattr(handler, register)(callback)


def _is_backward(args: Any) -> bool:
    return getattr(getattr(args, "callback_trigger", None), "name", None) == _BACKWARD


def _on_start(args: Any) -> None:
    with guard("could not time a lazy backward compile"):
        if _is_backward(args):
            state = _measured()
            with state.lock:
                state.backward_started[str(args.compile_id)] = time.perf_counter()


def _on_end(args: Any) -> None:
    with guard("could not time a lazy backward compile"):
        if not _is_backward(args):
            return
        compile_id = str(args.compile_id)
        state = _measured()
        with state.lock:
            started = state.backward_started.pop(compile_id, None)
            source_id = state.by_compile_id.get(compile_id)
        if started is not None and source_id is not None:
            _add(source_id, time.perf_counter() - started)
