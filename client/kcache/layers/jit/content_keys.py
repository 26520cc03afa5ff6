"""Content keys for JIT builds: what a build is made of, never where it happened.

JIT builders key their caches by things that differ between the nodes of a fleet: Inductor hashes
its compile command with the absolute include dirs of the Python install into its C++ keys; torch
cpp_extension and FlashInfer rebuild when a path, ``PATH`` or an mtime changes. A ``jit`` entry is
keyed by the build's content instead:

* each step's command line with its paths normalised: the output is ``<target>``, every input
  file is its sha256 (an input an earlier step of the same build produces is that step's hash),
  and the dirs of the Python install, torch, site-packages, the builder's cache dir and ``HOME``
  are named, not spelled (``-I<torch>/include``); any other path stays as written (a miss at
  worst, never a wrong hit);
* files the build reads that no command line names, by their sha256 (the headers the sources
  include: :mod:`kcache.layers.jit.headers`);
* the compiler's identity (its ``-v`` banner: version, target, configuration; not where it lives),
  the environment variables the compiler reads paths from, if set;
* the machine: the CPU (vendor, family, model, ISA flags: builders compile with ``-march=native``),
  the C library, the Python ABI (``EXT_SUFFIX``), and kcache's environment fingerprint (torch,
  triton, CUDA/HIP, GPU arch).

Never ``PATH``, ``HOME``, the current dir, host names or mtimes. The parts are kept by name (for
``kcache explain``: a miss names the part that differed).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

KEY_VERSION = "v1"
# Environment variables gcc and clang read include or library dirs from: they change a build
# without appearing in its command line.
COMPILER_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX")
# /proc/cpuinfo fields that decide what -march=native means (x86, then Arm); not clocks or ids.
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "flags", "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features")
# Lines of a compiler's -v banner that say where it was invoked from, not what it is.
_LOCAL_BANNER = re.compile(r"^(COLLECT_\w+=|InstalledDir:|Found candidate|Selected )")
# The same lines in a banner joined into one line with "_" (Inductor's get_compiler_version_info):
# each ends where the next "_Name=" or "_Name:" begins.
_JOINED_LOCAL = re.compile(r"(COLLECT_[A-Z_]+=|InstalledDir: )[^=]*?(_(?=[A-Z][A-Za-z_ ]*[=:])|$)")


@dataclass(frozen=True)
class Step:
    """One compiler invocation of a build: its command line and the file it writes."""

    command: str
    target: str


@dataclass(frozen=True)
class BuildKey:
    key: str  # "<adapter>-v1:<sha256>"; a valid entry key
    parts: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # name -> (hash, value)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=256)
def _file_sha(path: str, size: int, mtime_ns: int) -> str:
    """A file's sha256; memoised on (path, size, mtime) within this process only (the key never
    holds an mtime): a build's headers and sources are read again for every module otherwise."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha(path: str) -> str:
    st = os.stat(path)
    return _file_sha(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def cpu_identity() -> str:
    """What ``-march=native`` resolves to on this machine, from /proc/cpuinfo's first processor
    (no compiler run); elsewhere the platform's machine and processor names."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if found:
                        break  # the first processor's block is enough: the others are alike
                    continue
                name, sep, value = line.partition(":")
                name = name.strip()
                if sep and name in _CPU_FIELDS:
                    found[name] = " ".join(sorted(value.split())) if name in ("flags", "Features") else value.strip()
    except OSError:
        pass
    found["machine"] = platform.machine()
    if len(found) == 1:
        found["processor"] = platform.processor()
    return json.dumps(found, sort_keys=True)


@functools.lru_cache(maxsize=1)
def python_abi() -> str:
    return f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]} {sysconfig.get_config_var('EXT_SUFFIX') or ''} {getattr(sys, 'abiflags', '')}"


@functools.lru_cache(maxsize=1)
def libc() -> str:
    name, version = platform.libc_ver()
    return f"{name or 'libc'}{version or ''}"


@functools.lru_cache(maxsize=16)
def _banner(compiler: str) -> str:
    env = dict(os.environ, LC_ALL="C")
    for flag in ("-v", "--version"):
        try:
            out = subprocess.run([compiler, flag], capture_output=True, text=True, env=env, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        text = (out.stdout + out.stderr).strip()
        if out.returncode == 0 and text:
            return text
    return ""


def compiler_identity(compiler: str, banner: Callable[[str], str] | None = None) -> str:
    """The compiler's ``-v`` banner (version, target, configuration) without what says where it
    was run from. ``banner``: the builder's own memoised probe (Inductor runs ``-v`` once per
    process and joins its lines with ``_``), else one probe per compiler and process."""
    text = (banner or _banner)(compiler)
    if "\n" not in text.strip():
        text = _JOINED_LOCAL.sub("", text)
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not _LOCAL_BANNER.match(ln.strip())]
    return "\n".join(kept) or f"unknown compiler {os.path.basename(compiler)}"


@functools.lru_cache(maxsize=1)
def _install_roots() -> tuple[tuple[str, str], ...]:
    paths = sysconfig.get_paths()
    roots = [
        (paths.get("include"), "<python-include>"),
        (paths.get("platinclude"), "<python-include>"),
        (sysconfig.get_config_var("LIBDIR"), "<python-lib>"),
        (sysconfig.get_config_var("LIBPL"), "<python-libpl>"),
        (paths.get("purelib"), "<site-packages>"),
        (paths.get("platlib"), "<site-packages>"),
        (sys.prefix, "<python-prefix>"),
        (sys.exec_prefix, "<python-prefix>"),
        (sys.base_prefix, "<python-base>"),
        (os.path.expanduser("~"), "<home>"),
    ]
    return tuple((r, name) for r, name in roots if isinstance(r, str) and r)


class PathNames:
    """Named dirs, most specific first, matched at path boundaries (``/a/b`` names ``/a/b/c``,
    not ``/a/bc``); real and symlinked spellings both."""

    def __init__(self, extra: Iterable[tuple[str, str]] = ()) -> None:
        seen: dict[str, str] = {}
        for root, name in [*extra, *_install_roots()]:
            for spelled in {os.path.normpath(root), os.path.realpath(root)}:
                if spelled not in ("/", "") and spelled not in seen:
                    seen[spelled] = name
        ordered = sorted(seen.items(), key=lambda kv: -len(kv[0]))
        self._pattern = re.compile("|".join(f"({re.escape(r)})(?=/|$|[,:;=\\s])" for r, _ in ordered)) if ordered else None
        self._names = [name for _, name in ordered]

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._names[(m.lastindex or 1) - 1], text)


def normalise_step(step: Step, names: PathNames, built: Mapping[str, str]) -> tuple[str, list[str]]:
    """The step's command line, path-free, and the sha256 of each input file it names."""
    out: list[str] = []
    inputs: list[str] = []
    target = os.path.normpath(step.target)
    for token in shlex.split(step.command):
        path = os.path.normpath(token) if os.path.isabs(token) else None
        if path is not None and path == target:
            out.append("<target>" + os.path.splitext(path)[1])
        elif path is not None and path in built:
            out.append(f"<built:{built[path]}>")  # what an earlier step made, by how it was made
        elif path is not None and os.path.isfile(path):
            out.append(f"<input{len(inputs)}>")  # its content is a part of its own: step<i>.input<j>
            inputs.append(file_sha(path))
        else:
            out.append(names(token))
    return shlex.join(out), inputs


def build_key(adapter: str, steps: Sequence[Step], names: PathNames, environment: Mapping[str, str | None],
              banner: Callable[[str], str] | None = None, compilers: Sequence[str] | None = None,
              contents: Sequence[tuple[str, str]] = ()) -> BuildKey:
    """The content key of a build of ``steps`` (in order; the last writes the artifact), run by
    ``compilers`` (by default the first word of each step). ``contents``: ``(part name, sha256)``
    of files the build reads that its command lines do not name (included headers)."""
    parts: dict[str, tuple[str, str]] = {}

    def part(name: str, value: str, digest: str | None = None) -> None:
        parts[name] = (digest or _sha(value), value)

    part("adapter", adapter)
    built: dict[str, str] = {}
    found: list[str] = list(compilers or [])
    for i, step in enumerate(steps):
        command, inputs = normalise_step(step, names, built)
        part(f"step{i}.command", command)
        for j, digest in enumerate(inputs):
            part(f"step{i}.input{j}", digest, digest)
        built[os.path.normpath(step.target)] = _sha(json.dumps([command, inputs]))
        first = shlex.split(step.command)[:1] if compilers is None else []
        if first and first[0] not in found:
            found.append(first[0])
    for name, digest in contents:
        part(name, digest, digest)
    for compiler in found:
        part(f"compiler[{os.path.basename(compiler)}]", compiler_identity(compiler, banner))
    for var in COMPILER_ENV:
        if os.environ.get(var):
            part(f"env[{var}]", names(os.environ[var]))
    part("cpu", cpu_identity())
    part("libc", libc())
    part("python", python_abi())
    for name, value in sorted(environment.items()):
        part(f"environment[{name}]", str(value))
    digest = _sha(json.dumps({name: h for name, (h, _) in parts.items()}, sort_keys=True))
    return BuildKey(f"{adapter}-{KEY_VERSION}:{digest}", parts)
