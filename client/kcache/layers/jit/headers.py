"""The headers a JIT build's sources include, by content: what ninja's depfiles see, without a
compiler run.

A ``jit`` key must change when a header a source includes changes, yet it is computed on the node
that wants to skip the compiler, before any build: the compiler's own dependency output
(``-M``/``-MD``) would cost a preprocessor run on every hit (~1 s for ``torch/extension.h``, what
the Inductor adapter removed for its precompiled header). So kcache reads the ``#include``
directives itself, the way the preprocessor looks files up:

* ``#include "x.h"`` in the including file's dir, then the build's ``-iquote`` dirs, then as below;
  ``#include <x.h>`` in the build's ``-I``, ``-isystem`` and ``-idirafter`` dirs, in order;
* every header found is hashed and read in turn (recursively, each file once);
* a header under a *pinned* dir is neither hashed nor read: its content is fixed by what the key
  holds already (torch's headers by torch's version in the environment fingerprint, tvm-ffi's by
  its version, the Python install's by the Python ABI); one found in none of the build's dirs is
  the compiler's own or the system's (``<vector>``, ``<stdio.h>``: the compiler banner and the C
  library are in the key).

A header is named in the key by how it was included, relative to the dir it was found in (never
its absolute path: another checkout of the same sources has the same key), and by its sha256.
Directives inside ``#if`` blocks are all followed (a header the compiler skips can only turn a
hit into a miss); ``#include MACRO`` and headers included through another header of a pinned dir
are not seen (README says so).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kcache.layers.jit.content_keys import file_sha

# A directive at the start of a line; comments before the name are rare enough to be a miss.
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)
# A header read for its directives is at most this big (a generated table is not scanned
# further, only hashed): bounds the cost of a pathological include tree.
MAX_SCANNED_BYTES = 16 << 20
MAX_HEADERS = 4096


@dataclass(frozen=True)
class SearchPath:
    quote: Sequence[str] = ()  # -iquote
    angle: Sequence[str] = ()  # -I, -isystem, -idirafter, in the order the compiler searches them


def search_path(tokens: Iterable[str]) -> SearchPath:
    """The include dirs a compiler command line names (``-Idir``, ``-I dir``, ``-isystem dir``, ...).
    Only absolute dirs: a relative one depends on where the compiler runs."""
    quote: list[str] = []
    user: list[str] = []
    system: list[str] = []
    after: list[str] = []
    flags = {"-I": user, "-iquote": quote, "-isystem": system, "-idirafter": after}
    pending: list[str] | None = None
    for token in tokens:
        if pending is not None:
            target, pending = pending, None
            target.append(token)
            continue
        for flag, target in flags.items():
            if token == flag:
                pending = target
                break
            if token.startswith(flag) and flag == "-I":
                target.append(token[2:])
                break
    angle: list[str] = []
    for d in (*user, *system, *after):
        if os.path.isabs(d) and d not in angle:  # the compiler ignores a dir named twice
            angle.append(d)
    return SearchPath([d for d in quote if os.path.isabs(d)], angle)


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def included_headers(sources: Sequence[str], search: SearchPath, pinned: Iterable[str]) -> list[tuple[str, str]]:
    """``(name, sha256)`` of every header ``sources`` include, directly or through one another,
    found in ``search`` or beside the including file and not under a ``pinned`` dir; in the order
    first included (sources in the given order). Names repeat only as ``name#2``, ``name#3``."""
    roots = sorted({os.path.realpath(p) for p in pinned if p} | {os.path.normpath(p) for p in pinned if p})
    found: list[tuple[str, str]] = []
    names: dict[str, int] = {}
    seen: set[str] = set()
    stack: list[tuple[str, str | None]] = [(os.path.realpath(s), None) for s in reversed(sources)]
    while stack and len(found) < MAX_HEADERS:
        path, name = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            digest = file_sha(path)
            scan = os.path.getsize(path) <= MAX_SCANNED_BYTES
            text = _read(path) if scan else b""
        except OSError:
            continue
        if name is not None:
            names[name] = names.get(name, 0) + 1
            found.append((name if names[name] == 1 else f"{name}#{names[name]}", digest))
        here = os.path.dirname(path)
        includes: list[tuple[str, str]] = []
        for bracket, spelled in _INCLUDE.findall(text):
            written = spelled.decode("utf-8", "replace").strip()
            dirs = [here, *search.quote, *search.angle] if bracket == b'"' else list(search.angle)
            for d in dirs:
                candidate = os.path.normpath(os.path.join(d, written))
                if os.path.isfile(candidate):
                    real = os.path.realpath(candidate)
                    if not (_under(candidate, roots) or _under(real, roots)):
                        includes.append((real, written))
                    break
        stack.extend(reversed(includes))
    return found


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
