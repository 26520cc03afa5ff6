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
  kcache supplied (``load_s``: lookup, fetch, unpickle, check, write, initialize, install), and
  whether Dynamo then compiled a code of that package again (a guard that fails on this node:
  the work the package was to skip is done anyway).

**The rule**: a package does not pay, and is served to no other node, when Dynamo traced any of
its codes after kcache installed it, or when ``load_s >= compile_s``. A package whose producer
measured nothing is judged by the retrace alone. The consumer that finds it out has paid already;
what it does is the quarantine machinery's (:meth:`Runtime.quarantine` with ``unprofitable``): out
of its local tier and torch's dir, reported to the service (reason ``does not pay: ...``), which
then answers every node ``quarantined`` and refuses the key's uploads, so producers stop
re-uploading it and no node saves it at exit.
"""

from __future__ import annotations

import functools
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
class Measured:
    """What the payoff rule measured in one runtime (:meth:`Runtime.layer_state`): a reinstalled
    kcache starts with none of it, as a fresh process does."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    compile_s: dict[str, float] = field(default_factory=dict)  # source id -> seconds its compiles took
    by_compile_id: dict[str, str] = field(default_factory=dict)  # torch's compile id -> source id compiling
    backward_started: dict[str, float] = field(default_factory=dict)  # compile id -> its lazy backward's start
    # Packages kcache supplied and torch installed, until Dynamo compiles one of their codes.
    watched: weakref.WeakKeyDictionary[Any, tuple[Supplied, float]] = field(default_factory=weakref.WeakKeyDictionary)
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
    with state.lock:
        state.watched[package] = (supplied, load_s)


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
        watched = state.watched.pop(package, None)
    _ensure_callbacks()
    if watched is not None:
        supplied, load_s = watched
        name = getattr(code, "co_name", "?")
        on_verdict(supplied, f"Dynamo traced {name} again after kcache installed it (its guards failed here), "
                           f"on top of {load_s:.2f}s loading it")
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
