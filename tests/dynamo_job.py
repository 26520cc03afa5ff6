"""A user's job with Dynamo's precompile cache on, run by tests/test_dynamo_cache.py as a fresh
interpreter in the user's default environment (own HOME and TMPDIR, no cache dir set).

kcache activates from ``KCACHE_URL`` at interpreter start (``kcache_autoload.pth``); the job
never calls ``torch.compiler.save_cache_artifacts()`` and exits right after its compile. It
compiles an ``nn.Module`` with a graph break and runs one training step (forward, backward), then
prints ``RESULT <json>``: the outputs and gradients, and torch's own cache counters. With
``DYNAMO_JOB_FORWARD_ONLY=1`` it runs the forward alone: AOTAutograd saves a training graph only
once its backward is compiled, so torch's package of that job lacks its graphs ("Backend not
found") and marks their code bypassed. ``DYNAMO_JOB_BATCH=N`` (default 8): the input's batch size;
a package compiled for another one fails its shape guards, so Dynamo traces again.
``DYNAMO_JOB_THEN_BATCH=N``: after the step, one more forward with batch size N (a later call
with new shapes: Dynamo traces again whether or not a package served the first one).
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.perf_counter()
import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

T_IMPORTED = time.perf_counter()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # Matrix products only: Inductor calls ATen for them, so a fresh node's first step spends
        # no time in a C++ compiler (on the CPU, Inductor's FX-graph entries carry C++ source, not
        # the built library) and the test stays about Dynamo.
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        torch._dynamo.graph_break()  # a second frame: Dynamo's resume function is in the package too
        return self.down(h)


torch.manual_seed(0)
model = Net()
x = torch.randn(int(os.environ.get("DYNAMO_JOB_BATCH", "8")), 16)
t_call = time.perf_counter()
compiled = torch.compile(model)
out = compiled(x)
forward_only = os.environ.get("DYNAMO_JOB_FORWARD_ONLY") == "1"
if not forward_only:
    out.pow(2).sum().backward()
t_done = time.perf_counter()
# Not asserted anywhere (timings belong in bench/), only shown when a test fails.
print(f"TIMES import {T_IMPORTED - T0:.2f}s, first step {t_done - t_call:.2f}s", file=sys.stderr)
assert forward_only or model.up.weight.grad is not None
then = os.environ.get("DYNAMO_JOB_THEN_BATCH")
then_out = compiled(torch.randn(int(then), 16)) if then else None
print("RESULT " + json.dumps({
    "out": [round(v, 5) for v in out.detach().flatten().tolist()],
    "grad": None if forward_only else round(float(model.up.weight.grad.norm()), 5),
    "then_shape": None if then_out is None else list(then_out.shape),
    "precompile": bool(torch._dynamo.config.caching_precompile),
    "dynamo_cache": dict(counters["dynamo_cache"]),
    "fx_graph": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
    "aot_autograd": {k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")},
}))
