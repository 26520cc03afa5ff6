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
steer the compiler. Anything else (version probes, ``-M`` dependency files, output to stdout,
reading stdin) goes straight to the real compiler. The wrapper only replaces the compiler's
work: torch still decides what to build and loads what comes back, so what a test checks of
kcache (which builds happen, which a warm node skips: ``kcache_testkit.compilers`` logs before
this runs) is unchanged.

The cache lives outside the checkout (``~/.cache/kcache/test-compilers`` by default) and is pruned
to ``MAX_CACHE_BYTES`` when a session starts. ``KCACHE_TEST_COMPILER_CACHE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

WRAPPED = ("g++", "c++", "gcc", "cc")
KEY_VERSION = "2"
MAX_CACHE_BYTES = 2 << 30
# The call log (one line per compiler run, to see hits and misses) keeps its newest lines only.
MAX_LOG_BYTES = 1 << 20
# What makes a call uncacheable: output besides the one ``-o`` file (dependency files, kept
# temporaries), a listing on stdout, or input from stdin. Preprocessing into ``-o`` is a build.
UNCACHEABLE = frozenset({"-M", "-MM", "-MD", "-MMD", "-MF", "-MT", "-MQ", "-S", "-save-temps", "-", "-v", "--version", "-###"})
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


def build_key(real: str, args: list[str]) -> tuple[str, str] | None:
    """``(key, output path)`` for a build this cache can answer, else ``None``."""
    outputs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-o"]
    if len(outputs) != 1 or outputs[0] == "-" or any(a in UNCACHEABLE or a.startswith(("-MF", "-Wp,-M", "@")) for a in args):
        return None
    output = outputs[0]
    st = os.stat(real)
    h = hashlib.sha256(f"{KEY_VERSION}\0{real}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for name in STEERING_VARIABLES:
        h.update(f"{name}={os.environ.get(name, '')}\0".encode())
    skip_next = False
    for arg in args:
        if skip_next:  # the output's dir and name are not: the same build elsewhere is the same build
            skip_next = False
            h.update(f"-o <out>{os.path.splitext(arg)[1]}\0".encode())
            continue
        if arg == "-o":
            skip_next = True
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
            continue
        if arg.startswith("-") and "=" in arg and os.path.isfile(arg.split("=", 1)[1]):
            flag, value = arg.split("=", 1)
            h.update(f"F:{flag}={_file_digest(value)}\0".encode())
            continue
        h.update(f"A:{arg}\0".encode())
    return h.hexdigest(), output


def _store(cache_file: Path, output: str, stderr: bytes) -> None:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
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
        keyed = build_key(real, args)
    except OSError:
        keyed = None
    if keyed is None:
        os.execv(real, [real, *args])
    key, output = keyed
    cache_file = cache_dir / key[:2] / key[2:]
    t0 = time.perf_counter()
    if cache_file.is_file():
        try:
            _restore(cache_file, output)
        except OSError:
            pass
        else:
            stderr_file = cache_file.with_suffix(".stderr")
            if stderr_file.is_file():
                sys.stderr.buffer.write(stderr_file.read_bytes())
            _log(cache_dir, "hit", time.perf_counter() - t0, args)
            return 0
    proc = subprocess.run([real, *args], stderr=subprocess.PIPE)
    sys.stderr.buffer.write(proc.stderr)
    if proc.returncode == 0 and os.path.isfile(output):
        with contextlib.suppress(OSError):  # a full disk costs the cache, not the build
            _store(cache_file, output, proc.stderr)
    _log(cache_dir, "miss" if proc.returncode == 0 else f"failed-{proc.returncode}", time.perf_counter() - t0, args)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
