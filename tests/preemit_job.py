"""A job for tests/test_kernel_preemit.py, run as a fresh process in a node's default environment.

``JOB_ROLE=produce``: compiles real sm_90 Triton kernels (kcache's cache manager uploads them and
the workload lists them at exit). ``JOB_ROLE=consume``: what a training script does first —
imports torch, sets its own ``TORCHINDUCTOR_CACHE_DIR`` if ``SET_INDUCTOR_DIR`` says so, wraps a
function with ``torch.compile`` (kcache activates with Inductor), then calls it; it reports where
the pre-emit wrote and what ``TORCHINDUCTOR_CACHE_DIR`` held before its first call.
"""

from __future__ import annotations

import json
import os

from kcache_testkit.pace import HANG_S

report: dict[str, object] = {}
if os.environ["JOB_ROLE"] == "produce":
    import triton  # noqa: F401  (activates kcache's cache manager)

    from kcache_testkit.corpus import compile_small

    report["keys"] = [d.name for d in compile_small(os.environ["TRITON_CACHE_DIR"], count=3)]
else:
    import torch

    if chosen := os.environ.get("SET_INDUCTOR_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = chosen  # after import torch, as scripts do
    step = torch.compile(lambda x: x * 2 + 1)

    from kcache.current import get_runtime
    from kcache.layers.inductor.kernel_preemit import PreEmit

    rt = get_runtime()
    assert rt is not None
    state = rt.layer_state(PreEmit)
    if state.thread is not None:
        state.thread.join(HANG_S)
    report.update(pre_emitted=state.emitted, dir=str(state.cache_dir), started=state.thread is not None,
                  inductor_dir_before_first_call=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    report["out"] = step(torch.ones(3)).tolist()

from kcache.current import get_runtime  # noqa: E402

rt = get_runtime()
if rt is not None:
    rt.close()
    report["stats"] = {name: c.model_dump() for name, c in rt.stats.snapshot().items()}
print("REPORT " + json.dumps(report))
