"""A user's CPU job for the ``jit`` layer's tests and benchmark, run as a fresh interpreter in a
node's default environment (:class:`kcache_testkit.nodes.Node`; kcache only through ``KCACHE_URL``).

One ``torch.compile`` of a two-layer MLP: Inductor's CPU backend compiles its kernels into a C++
module (and, on a fresh node, its ISA probe libraries). Prints ``RESULT <json>``: the first
call's seconds and the output, rounded (runs with and without kcache must agree).
"""

from __future__ import annotations

import json
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))
x = torch.randn(8, 64)
started = time.perf_counter()
out = torch.compile(model)(x)
first_call_s = time.perf_counter() - started
print("RESULT " + json.dumps({"first_call_s": first_call_s, "out": [round(v, 5) for v in out.flatten().tolist()]}))
