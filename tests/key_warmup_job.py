"""A job for tests/test_triton_key_warmup.py, run as a fresh process in a node's default environment.

What a training script does first: imports torch, wraps a function with ``torch.compile`` (kcache
activates with Inductor), then calls it. ``FORGET_PACKAGE`` names a Triton package the job drops
from ``sys.modules`` first (so that it counts as not imported). It reports what kcache's warm-up
did and what Triton's cached key held before the first call.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from kcache_testkit.pace import HANG_S

if forget := os.environ.get("FORGET_PACKAGE"):
    import triton  # noqa: F401

    del sys.modules[forget]
step = torch.compile(lambda x: x * 2 + 1)

from kcache.current import get_runtime  # noqa: E402
from kcache.layers.triton.key_warmup import KeyWarmup  # noqa: E402
from torch._inductor.runtime.triton_compat import triton_key  # noqa: E402  (the one torch calls)

rt = get_runtime()
assert rt is not None
state = rt.layer_state(KeyWarmup)
if state.thread is not None:
    state.thread.join(HANG_S)
info = triton_key.cache_info()
report: dict[str, object] = {
    "outcome": state.outcome, "seconds": state.seconds, "cached": info.currsize, "computed": info.misses,
    "forgotten_back": bool(forget) and forget in sys.modules,
}
report["key_is_triton_version_and_hashes"] = triton_key().startswith(__import__("triton").__version__)
report["computed_after_asking"] = triton_key.cache_info().misses
report["out"] = step(torch.ones(3)).tolist()
rt.close()
print("REPORT " + json.dumps(report))
