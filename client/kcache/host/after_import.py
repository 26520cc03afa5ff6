"""Modules that have finished importing, and callbacks for when one does.

The rule (DESIGN.md, "Living inside someone else's process"): kcache never imports torch or
Triton from a background thread, and never calls into or caches facts from a module whose import
has not finished. ``"torch" in sys.modules`` is already true while the main thread is inside
``import torch``; a thread that then imports ``torch._inductor...`` runs torch's module code
concurrently with the main thread's and breaks its ``import torch`` ("cannot import name 'Node'
from partially initialized module 'torch.fx'"). :func:`imported` is the only question kcache asks
of another package's import state.

kcache also installs while torch is still importing itself (right after
``torch._inductor.triton_bundler`` loads, with ``torch._functorch.aot_autograd`` and
``torch._inductor.codecache`` half-initialised), so some hooks must wait for their module.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

# kcache's own threads are named with this prefix; callbacks never run on them.
KCACHE_THREAD_PREFIX = "kcache-"
_lock = threading.Lock()


def _on_kcache_thread() -> bool:
    return threading.current_thread().name.startswith(KCACHE_THREAD_PREFIX)


def _unregister(finder: Any) -> bool:
    """Take ``finder`` off sys.meta_path; True for the one caller that did (threads race here).

    A new list, not ``remove()``: the import system walks the very list object while it asks each
    finder, so removing the one asked now would shift the next finder (another kcache hook
    waiting for exactly this import) past the walk, and that hook would never fire."""
    with _lock:
        if not any(f is finder for f in sys.meta_path):
            return False
        sys.meta_path = [f for f in sys.meta_path if f is not finder]
        return True


def imported(name: str) -> ModuleType | None:
    """The module if its import has finished, else None (not imported, or still running). Never
    imports anything."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None  # not imported yet, or its code is still running
    return module


class _Finder:  # a meta path finder for one module, removed once it fired
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name or not _unregister(self):
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.callback)  # type: ignore[assignment]
        return spec


class _Loader:
    def __init__(self, inner: Any, callback: Callable[[ModuleType], None]) -> None:
        self._inner, self._callback = inner, callback

    def __getattr__(self, name: str) -> Any:
        if name in ("_inner", "_callback"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._callback(module)


class _WhenInitialised:  # a meta path finder that finds nothing: it watches every later import
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> None:
        # Any thread's import passes here. The callback patches torch: never on kcache's own
        # threads (the prefetcher), and exactly once however many threads import at once.
        if _on_kcache_thread():
            return None
        module = imported(self.name)
        if module is not None and _unregister(self):
            self.callback(module)
        return None


def call_after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """``callback(module)`` now if ``name`` is imported, else right after its import finishes.

    A module whose import has started but not finished (kcache installs in the middle of torch's
    own imports) is called back at the first import anywhere after it finished: torch imports
    lazily all through a compile, long before a graph is looked up. Modules that bound a name
    from it by then are the callback's to update."""
    module = imported(name)
    if module is not None:
        callback(module)
    elif name not in sys.modules:
        sys.meta_path.insert(0, _Finder(name, callback))
    else:
        sys.meta_path.insert(0, _WhenInitialised(name, callback))
