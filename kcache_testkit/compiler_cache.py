"""A content-keyed C/C++ compiler cache for the test suite's job interpreters.

Most tests start real interpreters that run ``torch.compile`` on the CPU, each on a fresh node
(its own ``HOME`` and ``TMPDIR``), so every one of them pays Inductor's C++ builds again: three
vector-ISA probes, the precompiled header and the kernels — about 13 s of g++ in a 22 s job on
these 2-core machines, for the same few sources over and over. ``ccache`` cannot take them:
Inductor compiles and links in one call, and it passes its precompiled header by path.

``install(bin_dir, cache_dir)`` writes one wrapper per compiler name found on ``PATH`` (``g++``,
``c++``, ``gcc``, ``cc``) that runs this file. A build it can key and that writes one ``-o``
output is answered from the cache when the same build ran before, else run for real and stored.
The key: every argument, each one that names a file replaced by the file's content hash; the
compiler binary; the identity of each ``-I<dir>`` (as Inductor passes them); the variables that
steer the compiler. Anything else (version probes, ``-M`` listings, output to stdout, reading
stdin) goes straight to the real compiler. The wrapper only replaces the compiler's
work: torch still decides what to build and loads what comes back, so what a test checks of
kcache (which builds happen, which a warm node skips: ``kcache_testkit.compilers`` logs before
this runs) is unchanged.

Dependency files: torch's and tvm-ffi's extension JITs compile each source with ninja's
``-MMD -MF $out.d ... -c $in -o $out`` (``deps = gcc``: ninja reads the depfile once the compiler
exits, then deletes it), in a build dir under each node's ``HOME``. Such a call is keyed without
the depfile's and the output's paths, and its depfile is kept with the output's and the file
arguments' paths (the sources) as placeholders, written back with the caller's own paths on a
hit, so ninja records the right dependencies. A call naming a path that gcc would escape in a
depfile (space, ``$``, ``#``, ``:``, backslash) is not cached; one whose depfile lacks its
target, or names a header beside a source (in no key, and elsewhere on another node), is
compiled but not stored. ``-MT``/``-MQ`` (another target) and ``-Wp,-M...`` stay uncached.

The cache lives outside the checkout (``~/.cache/kcache/test-compilers`` by default) and is pruned
to ``MAX_CACHE_BYTES`` when a session starts. ``KCACHE_TEST_COMPILER_CACHE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

WRAPPED = ("g++", "c++", "gcc", "cc")
KEY_VERSION = "2"
MAX_CACHE_BYTES = 2 << 30
# The call log (one line per compiler run, to see hits and misses) keeps its newest lines only.
MAX_LOG_BYTES = 1 << 20
# What makes a call uncacheable: output besides the one ``-o`` file (kept temporaries, a
# dependency file for another target), a listing on stdout, or input from stdin. Preprocessing
# into ``-o`` is a build; so is a ``-c`` compile that writes its dependencies to one ``-MF`` file.
UNCACHEABLE = frozenset({"-M", "-MM", "-MT", "-MQ", "-S", "-save-temps", "-", "-v", "--version", "-###"})
UNCACHEABLE_PREFIXES = ("-MT", "-MQ", "-Wp,-M", "@")
WRITES_DEPFILE = frozenset({"-MD", "-MMD"})
# What gcc escapes in a depfile (a space, ``$``, ``#``) or ninja's parser splits on: a depfile
# call with an output or a file argument whose path holds one is not cached.
UNPORTABLE_IN_DEPFILE = frozenset(" \t\n$#:\\")
# A depfile's word: escaped characters (``\ ``) and all but blanks; a lone ``\`` ends a line.
_DEPFILE_WORD = re.compile(rb"(?:\\[^\n]|[^\s\\])+")
# The node's own paths in a stored depfile: NUL is in no path, so in no depfile gcc writes.
_PLACEHOLDER = re.compile(rb"\0(o|i[0-9]+)\0")
# The environment a gcc driver reads (man gcc, "Environment Variables").
STEERING_VARIABLES = (
    "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX",
    "COMPILER_PATH", "SOURCE_DATE_EPOCH", "LANG", "LC_ALL",
)  # fmt: skip
SWITCH = "KCACHE_TEST_COMPILER_CACHE"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    # Imported here: the wrappers run this file on its own (``python -S``, stdlib only).
    from kcache_testkit import knobs

    return knobs.switch(SWITCH, True, environ)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kcache" / "test-compilers"


def install(bin_dir: Path, cache_dir: Path) -> Path:
    """Write the wrappers into ``bin_dir`` (put it first on ``PATH``); returns ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name in WRAPPED:
        # The path as found, not resolved: gcc names itself after argv[0] (`g++ --version`
        # says "g++ (Debian ...)", its resolved x86_64-linux-gnu-g++-12 says that name), and
        # Inductor and kcache key builds on that banner.
        real = shutil.which(name, path=_path_without(bin_dir))
        if real is None:
            continue
        script = (
            "#!/bin/sh\n"
            f"exec {shlex.quote(sys.executable)} -S {shlex.quote(__file__)} "
            f'{shlex.quote(str(cache_dir))} {shlex.quote(real)} "$@"\n'
        )
        # Written aside and renamed: a worker of the same session may be running the old one.
        fd, tmp = tempfile.mkstemp(dir=bin_dir, prefix=f".{name}.")
        with os.fdopen(fd, "w") as f:
            f.write(script)
        os.chmod(tmp, 0o755)
        os.replace(tmp, bin_dir / name)
    return bin_dir


def prune(cache_dir: Path, max_bytes: int = MAX_CACHE_BYTES, max_log_bytes: int = MAX_LOG_BYTES) -> None:
    """Drop the least recently used outputs until the cache holds at most ``max_bytes``; cut the
    call log to its newest lines, about half of ``max_log_bytes``, once it passes that."""
    if not cache_dir.is_dir():
        return
    _cut_log(cache_dir / "calls.log", max_log_bytes)
    entries = []
    for path in cache_dir.glob("??/*"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size


def _cut_log(log: Path, max_bytes: int) -> None:
    try:
        if log.stat().st_size <= max_bytes:
            return
        with open(log, "rb") as f:
            f.seek(-(max_bytes // 2), os.SEEK_END)
            tail = f.read()
    except FileNotFoundError:
        return
    tail = tail[tail.find(b"\n") + 1:]  # from the first whole line
    fd, tmp = tempfile.mkstemp(dir=log.parent, prefix=".calls.")
    with os.fdopen(fd, "wb") as f:
        f.write(tail)
    os.replace(tmp, log)


def _path_without(bin_dir: Path) -> str:
    own = os.path.realpath(bin_dir)
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and os.path.realpath(p) != own)


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Build(NamedTuple):
    """A call this cache can answer: its key, its ``-o`` output, and for a ninja-style compile
    the ``-MF`` depfile and the file arguments (the sources), in order, as the call names them."""

    key: str
    output: str
    depfile: str | None = None
    inputs: tuple[str, ...] = ()


def build_key(real: str, args: list[str]) -> Build | None:
    """The :class:`Build` for a call this cache can answer, else ``None``."""
    outputs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-o"]
    if len(outputs) != 1 or outputs[0] == "-" or any(a in UNCACHEABLE or a.startswith(UNCACHEABLE_PREFIXES) for a in args):
        return None
    output = outputs[0]
    depfiles = [(args[i + 1] if i + 1 < len(args) else "") if a == "-MF" else a[3:] for i, a in enumerate(args) if a.startswith("-MF")]
    writes_deps = bool(WRITES_DEPFILE.intersection(args))
    # Of dependency files, only ninja's compile: one source's, the output as target, to one file.
    if (depfiles or writes_deps) and not (writes_deps and len(depfiles) == 1 and depfiles[0] not in ("", "-") and "-c" in args):
        return None
    depfile = depfiles[0] if depfiles else None
    st = os.stat(real)
    h = hashlib.sha256(f"{KEY_VERSION}\0{real}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for name in STEERING_VARIABLES:
        h.update(f"{name}={os.environ.get(name, '')}\0".encode())
    inputs: list[str] = []
    skip_next = ""
    for arg in args:
        if skip_next == "-o":  # the output's dir and name are not: the same build elsewhere is the same build
            skip_next = ""
            h.update(f"-o <out>{os.path.splitext(arg)[1]}\0".encode())
            continue
        if skip_next == "-MF":  # nor the depfile's: it is written from the stored one
            skip_next = ""
            continue
        if arg in ("-o", "-MF"):
            skip_next = arg
            if arg == "-MF":
                h.update(b"-MF <deps>\0")
            continue
        if arg.startswith("-MF"):
            h.update(b"-MF <deps>\0")
            continue
        if arg.startswith("-I") and len(arg) > 2:
            # Headers are read through -I dirs: a reinstalled package is a new directory.
            try:
                d = os.stat(arg[2:])
                h.update(f"I:{arg}:{d.st_ino}:{d.st_mtime_ns}\0".encode())
            except OSError:
                h.update(f"I:{arg}:missing\0".encode())
            continue
        if not arg.startswith("-") and os.path.isfile(arg):
            # Inputs by content, not by name: each test's node has its own cache dir.
            h.update(f"F:{os.path.basename(arg)}:{_file_digest(arg)}\0".encode())
            inputs.append(arg)
            continue
        if arg.startswith("-") and "=" in arg and os.path.isfile(arg.split("=", 1)[1]):
            flag, value = arg.split("=", 1)
            h.update(f"F:{flag}={_file_digest(value)}\0".encode())
            inputs.append(value)
            continue
        h.update(f"A:{arg}\0".encode())
    if depfile is not None and any(UNPORTABLE_IN_DEPFILE.intersection(path) for path in (output, *inputs)):
        return None  # gcc would escape it in the depfile: written for real, not rewritten here
    return Build(h.hexdigest(), output, depfile, tuple(inputs))


def _portable_depfile(text: bytes, build: Build) -> bytes | None:
    """The depfile with the call's output and file arguments as placeholders, or ``None`` when
    it cannot serve another node: its target is not the output, or it names a file beside a
    source (a header found next to it: in no key, and at another path on another node)."""
    names = {os.fsencode(path): b"\0i%d\0" % n for n, path in reversed(list(enumerate(build.inputs)))}
    names[os.fsencode(build.output)] = b"\0o\0"

    def swap(word: re.Match[bytes]) -> bytes:
        path = word.group(0)
        colon = path.endswith(b":")
        name = names.get(path[:-1] if colon else path)
        return path if name is None else name + (b":" if colon else b"")

    if b"\0" in text:
        return None
    portable = _DEPFILE_WORD.sub(swap, text)
    if not portable.startswith(b"\0o\0:"):
        return None
    beside = [os.path.join(os.path.dirname(os.path.abspath(path)), "") for path in build.inputs]
    for word in _DEPFILE_WORD.findall(portable):
        if b"\0" not in word and os.path.abspath(os.fsdecode(word.rstrip(b":"))).startswith(tuple(beside)):
            return None
    return portable


def _local_depfile(stored: bytes, build: Build) -> bytes:
    """A stored depfile with this call's paths; ``KeyError`` when it names a file argument the
    call lacks (the key says it cannot)."""
    names = {b"o": build.output, **{b"i%d" % n: path for n, path in enumerate(build.inputs)}}
    return _PLACEHOLDER.sub(lambda m: os.fsencode(names[m.group(1)]), stored)


def _store(cache_file: Path, output: str, stderr: bytes, depfile: bytes | None = None) -> None:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    if depfile is not None:  # before the output: an entry's output without its depfile is a miss
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=".in.")
        with os.fdopen(fd, "wb") as f:
            f.write(depfile)
        os.replace(tmp, cache_file.with_suffix(".d"))
    fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=".in.")
    os.close(fd)
    shutil.copyfile(output, tmp)
    os.chmod(tmp, os.stat(output).st_mode & 0o777)
    os.replace(tmp, cache_file)
    if stderr:
        cache_file.with_suffix(".stderr").write_bytes(stderr)


def _restore(cache_file: Path, output: str) -> None:
    out_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".kcache-cc.")
    os.close(fd)
    shutil.copyfile(cache_file, tmp)
    os.chmod(tmp, os.stat(cache_file).st_mode & 0o777)
    os.replace(tmp, output)  # whole or not at all: the loader may look at it right away
    os.utime(cache_file)  # recently used: kept by prune


def _log(cache_dir: Path, what: str, seconds: float, args: list[str]) -> None:
    line = f"{time.time():.3f}\t{what}\t{seconds:.3f}\t{shlex.join(args)[:300]}\n"
    with open(cache_dir / "calls.log", "a") as f:
        f.write(line)


def main(argv: list[str]) -> int:
    cache_dir, real, args = Path(argv[0]), argv[1], argv[2:]
    try:
        build = build_key(real, args)
    except OSError:
        build = None
    if build is None:
        os.execv(real, [real, *args])
    cache_file = cache_dir / build.key[:2] / build.key[2:]
    t0 = time.perf_counter()
    if cache_file.is_file():
        try:
            if build.depfile is not None:  # an entry without one (pruned) is a miss
                deps = _local_depfile(cache_file.with_suffix(".d").read_bytes(), build)
                os.makedirs(os.path.dirname(os.path.abspath(build.depfile)), exist_ok=True)
                with open(build.depfile, "wb") as f:  # as gcc writes it: ninja reads it once we exit
                    f.write(deps)
            _restore(cache_file, build.output)
        except (OSError, KeyError):
            pass
        else:
            stderr_file = cache_file.with_suffix(".stderr")
            if stderr_file.is_file():
                sys.stderr.buffer.write(stderr_file.read_bytes())
            _log(cache_dir, "hit", time.perf_counter() - t0, args)
            return 0
    proc = subprocess.run([real, *args], stderr=subprocess.PIPE)
    sys.stderr.buffer.write(proc.stderr)
    what = "miss" if proc.returncode == 0 else f"failed-{proc.returncode}"
    if proc.returncode == 0 and os.path.isfile(build.output):
        with contextlib.suppress(OSError):  # a full disk costs the cache, not the build
            depfile = None if build.depfile is None else _portable_depfile(Path(build.depfile).read_bytes(), build)
            if build.depfile is not None and depfile is None:
                what = "unstored"  # compiled, but its depfile would not fit another node
            else:
                _store(cache_file, build.output, proc.stderr, depfile)
    _log(cache_dir, what, time.perf_counter() - t0, args)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
