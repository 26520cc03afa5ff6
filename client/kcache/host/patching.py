"""One registry for every attribute kcache replaces on torch or Triton.

Install, reinstall and uninstall behave as a user expects only if every patch is recorded in one
place: ``patch`` remembers what was there (the object's own attribute, or that it was inherited),
``restore`` puts back exactly that, and a group installed twice is patched once.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class _Patch:
    owner: Any
    name: str
    original: Any  # current() before the patch; _MISSING when inherited or absent
    replacement: Any


_patches: dict[str, list[_Patch]] = {}
_lock = threading.RLock()


def current(owner: Any, name: str) -> Any:
    """What ``owner.name`` is now: a class's own attribute (its ``__dict__``, so classmethod and
    staticmethod objects stay wrapped, and an inherited one reads as missing); for anything else
    (a module, a torch config module) the attribute's value."""
    if isinstance(owner, type):
        return vars(owner).get(name, _MISSING)
    return getattr(owner, name, _MISSING)


def patch(group: str, owner: Any, name: str, replacement: Any) -> None:
    """Set ``owner.name = replacement`` and remember how to undo it under ``group``."""
    with _lock:
        original = current(owner, name)
        setattr(owner, name, replacement)
        _patches.setdefault(group, []).append(_Patch(owner, name, original, replacement))


def is_patched(group: str) -> bool:
    with _lock:
        return bool(_patches.get(group))


def restore(group: str) -> None:
    """Undo ``group``'s patches, newest first. A patch someone else replaced since is left alone."""
    with _lock:
        for p in reversed(_patches.pop(group, [])):
            if current(p.owner, p.name) is not p.replacement:
                continue  # torch or the user set it again after us: theirs stands
            if p.original is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(p.owner, p.name)
            else:
                setattr(p.owner, p.name, p.original)


def restore_all() -> None:
    with _lock:
        for group in list(_patches):
            restore(group)
