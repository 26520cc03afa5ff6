"""Benchmark-only: log every ``triton.compile`` call of every process of a benchmark node.

``bench/gpu_e2e.py`` puts this directory on the nodes' ``PYTHONPATH`` and sets
``KCACHE_BENCH_TRACE_DIR``. Inductor's compile workers inherit both, so the log shows whether a
warm node compiled anything anywhere (a cache hit still goes through ``triton.compile``). The
listener is installed when ``triton.knobs`` is first imported, so processes that never use
Triton pay one dict lookup.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

_DIR = os.environ.get("KCACHE_BENCH_TRACE_DIR")


def _listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
    stages_us = sum(d for _, d in getattr(times, "lowering_stages", []) or [])
    record = {"t": time.time(), "pid": os.getpid(), "name": dict(metadata).get("name"), "hit": cache_hit, "lower_us": stages_us}
    with open(os.path.join(_DIR or ".", f"compiles-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


class _Finder:
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "triton.knobs":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            inner = spec.loader

            class _Loader:
                def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...
                    return getattr(inner, name)

                def create_module(self, spec: Any) -> Any:
                    return inner.create_module(spec)

                def exec_module(self, module: Any) -> None:
                    inner.exec_module(module)
                    module.compilation.listener = _listener

            spec.loader = _Loader()
        return spec


if _DIR:
    sys.meta_path.insert(0, _Finder())
