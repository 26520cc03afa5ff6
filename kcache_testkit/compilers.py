"""A ``PATH`` shim that records every C/C++/CUDA compiler run of a job.

``make_shim(dir)`` writes one wrapper per compiler name found on ``PATH`` (``c++``, ``g++``,
``gcc``, ``cc``, ``clang``, ``clang++``, ``nvcc``): it appends its name and arguments to a log
file, then ``exec``s the real compiler. A job run with ``shim.path(...)`` first on its ``PATH``
leaves one line per compiler run, whoever started it (Inductor, torch's cpp_extension, ninja).
Version probes (``g++ -v``, ``--version``) are told apart from builds: toolchains probe on every
start, with or without a cache.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

COMPILERS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "nvcc")
PROBE_FLAGS = frozenset({"-v", "--version", "-V", "-dumpversion", "-dumpfullversion", "-dumpmachine"})


@dataclass(frozen=True)
class CompilerShim:
    bin_dir: Path
    log: Path

    def path(self, rest: str | None = None) -> str:
        """A ``PATH`` with the shim first."""
        return os.pathsep.join([str(self.bin_dir), rest if rest is not None else os.environ.get("PATH", "")])

    def calls(self) -> list[list[str]]:
        """Every compiler run so far: ``[name, arg, ...]``."""
        if not self.log.exists():
            return []
        return [line.split("\t") for line in self.log.read_text().splitlines() if line]

    def builds(self) -> list[list[str]]:
        """The runs that compile, preprocess or link anything (all but version probes)."""
        return [c for c in self.calls() if not (c[1:] and set(c[1:]) <= PROBE_FLAGS)]

    def reset(self) -> None:
        self.log.unlink(missing_ok=True)


def make_shim(bin_dir: Path, log: Path | None = None) -> CompilerShim:
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = log or bin_dir / "calls.log"
    for name in COMPILERS:
        real = shutil.which(name)
        if real is None:
            continue
        script = bin_dir / name
        # One printf per run: concurrent compilers (parallel builds) append whole lines.
        script.write_text(
            "#!/bin/sh\n"
            f"line={shlex.quote(name)}\n"
            'for a in "$@"; do line="$line\t$a"; done\n'
            f"printf '%s\\n' \"$line\" >> {shlex.quote(str(log))}\n"
            f'exec {shlex.quote(real)} "$@"\n'
        )
        script.chmod(0o755)
    return CompilerShim(bin_dir, log)
