"""The content key of a ninja-built JIT extension: the ``build.ninja`` a builder just wrote, and
what it reads.

torch's cpp_extension and tvm-ffi (FlashInfer's builder) both write a ``build.ninja`` into their
build dir and run ninja there; ninja decides from its log and mtimes, which a fresh node lacks.
kcache keys such a build by (:func:`kcache.layers.jit.content_keys.build_key`):

* every line of ``build.ninja`` (all flags builder and user chose, the compilers, the rules), its
  paths named (the build dir is ``<build>``; the builder's and the Python install's dirs), each
  absolute input file by its sha256;
* a file a ``build`` line or a variable names relative to the build dir and that no ``build`` line
  makes (tvm-ffi's embedded ``<name>.cubin``) by its sha256;
* the contents of the headers the sources include (:mod:`kcache.layers.jit.headers`), headers under
  ``pinned`` dirs aside;
* the compilers' ``-v`` banners, the CPU, the C library, the Python ABI and ``environment``.
"""

from __future__ import annotations

import os
import re
import shlex
import sysconfig
from collections.abc import Iterable, Mapping, Sequence

from kcache.layers.jit.content_keys import BuildKey, PathNames, Step, build_key, file_sha
from kcache.layers.jit.headers import included_headers, search_path

BUILD_FILE = "build.ninja"
# Tool variables builders write ("cxx = c++", "nvcc = /usr/local/cuda/bin/nvcc", "cc = cc").
_TOOL = re.compile(r"^(cxx|cc|nvcc|sycl|hipcc)\s*=\s*(\S.*)$")
_BUILD = re.compile(r"^build\s+(.+?)(?<!\$):\s*(\S+)\s*(.*)$")
_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".cu", ".hip", ".sycl", ".h", ".hpp", ".cuh")


def read_lines(build_directory: str) -> list[str]:
    """``build.ninja``'s lines without comments and blank lines."""
    with open(os.path.join(build_directory, BUILD_FILE), encoding="utf-8") as f:
        return [ln.rstrip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]


def _unescape(text: str) -> str:
    return text.replace("$:", ":").replace("$ ", " ").replace("$$", "$")


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(_unescape(text))
    except ValueError:
        return _unescape(text).split()


def default_target(lines: Sequence[str]) -> str | None:
    """The file ninja builds by default (the last ``default`` line), relative to the build dir."""
    targets = [ln.split()[1] for ln in lines if ln.startswith("default ") and len(ln.split()) == 2]
    return _unescape(targets[-1]) if targets else None


def build_key_of(adapter: str, build_directory: str, names: Iterable[tuple[str, str]], pinned: Iterable[str],
                 environment: Mapping[str, str | None], lines: Sequence[str] | None = None) -> BuildKey:
    """The content key of the build ``build_directory/build.ninja`` describes (``names``: dirs
    named in the key, beside ``<build>``; ``pinned``: dirs whose headers the key holds by version)."""
    lines = read_lines(build_directory) if lines is None else lines
    compilers = [m.group(2).strip() for ln in lines if (m := _TOOL.match(ln))]
    outputs: set[str] = set()
    sources: list[str] = []
    relative: list[str] = []
    for ln in lines:
        if (m := _BUILD.match(ln)) is not None:
            outputs.update(_tokens(m.group(1)))
            sources.extend(t for t in _tokens(m.group(3)) if os.path.isabs(t) and t.endswith(_SOURCE_SUFFIXES))
    for ln in lines:
        for token in _tokens(ln):
            if (not os.path.isabs(token) and token not in outputs and token not in relative and "/" not in token.rstrip("/")
                    and os.path.isfile(os.path.join(build_directory, token)) and token != BUILD_FILE):
                relative.append(token)
    search = search_path(t for ln in lines for t in _tokens(ln))
    contents = [(f"file[{name}]", file_sha(os.path.join(build_directory, name))) for name in sorted(relative)]
    python = [sysconfig.get_paths().get(k) or "" for k in ("include", "platinclude")]  # fixed by the Python ABI
    contents += [(f"header[{name}]", digest) for name, digest in included_headers(sources, search, [*pinned, *python])]
    path_names = PathNames([(build_directory, "<build>"), *names])
    # Each line a part of the key: `kcache explain` names the lines that differ.
    steps = [Step(line, os.path.join(build_directory, BUILD_FILE)) for line in lines]
    return build_key(adapter, steps, path_names, environment, compilers=compilers, contents=contents)
