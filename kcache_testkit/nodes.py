"""A machine's user account for end-to-end jobs: its own HOME and TMPDIR, nothing else set.

Jobs run in the user's default environment (no TRITON_CACHE_DIR, no TORCHINDUCTOR_CACHE_DIR, no
KCACHE_LOCAL_DIR: every cache dir lands under this node's HOME or TMPDIR), so two nodes share
nothing but the service they are told about.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Node:
    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    def env(self, **settings: str) -> dict[str, str]:
        """This process's environment without any KCACHE_*/TRITON_*/TORCHINDUCTOR_* setting, with
        the node's HOME and TMPDIR, plus ``settings``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TRITON_", "TORCHINDUCTOR_"))}
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        env.update(HOME=str(self.home), TMPDIR=str(self.root / "tmp"), PYTHONUNBUFFERED="1", **settings)
        return env
