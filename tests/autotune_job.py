"""A node's autotune lookup through Inductor's real ``AutotuneCache`` (CPU: no Triton autotuning
runs here, so the job calls what a GPU job calls), run by tests/test_autotune_paths.py as a fresh
interpreter in the user's default environment; kcache activates from ``KCACHE_URL``.

``argv[1]``: the kernel's source file as the autotuner names it (``-``: one in this node's own
Inductor cache dir). A node that finds no winner saves one, as Inductor does after benchmarking;
a warm node given the producer's path is what a statically launched autotuner from an FX-graph
entry asks (``CachingAutotuner.recheck_autotune_cache``). Prints ``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import sys

import torch._inductor.codecache  # noqa: F401  (Inductor in use: kcache activates here)
from torch._inductor.runtime.runtime_utils import cache_dir
from torch._inductor.runtime.triton_compat import Config
from torch._inductor.runtime.triton_heuristics import check_autotune_cache

KERNEL = "cgjlvkxe5xw3j3oquvqk3iyzclgcxyvh4rqltnb6zzx7kwrs4qm7.py"
META = {"autotune_local_cache": True, "autotune_remote_cache": True, "backend_hash": "cpu-test-backend",
        "coordinate_descent_tuning": False, "is_fbcode": False}
configs = [Config({"XBLOCK": 64}, num_warps=2), Config({"XBLOCK": 256}, num_warps=8)]
filename = os.path.join(cache_dir(), KERNEL[1:3], KERNEL) if sys.argv[1] == "-" else sys.argv[1]
found, autotune_cache, info = check_autotune_cache(configs, filename, META)
if info.get("autotune_cache_state") == "miss" and autotune_cache is not None:
    autotune_cache.save(configs[1], time_taken_ns=3_000_000)  # "benchmarked": the second wins
print("RESULT " + json.dumps({"state": info.get("autotune_cache_state"), "best": found[0].kwargs if len(found) == 1 else None,
                              "filename": filename}))
