"""A user's job that builds a torch C++ extension with ``torch.utils.cpp_extension.load_inline``
(ninja, in ``~/.cache/torch_extensions/...`` under the node's ``HOME``), run as a fresh interpreter
on a node (:class:`kcache_testkit.nodes.Node`; kcache only through ``KCACHE_URL``). Prints
``RESULT <json>``: the seconds ``load_inline`` took and what the extension computed."""

from __future__ import annotations

import json
import time

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = """
torch::Tensor scaled_add(torch::Tensor x, torch::Tensor y, double alpha) {
  return x + alpha * y;
}
"""

started = time.perf_counter()
ext = load_inline(name="kcache_scaled_add", cpp_sources=[SOURCE], functions=["scaled_add"])  # type: ignore[no-untyped-call]
load_s = time.perf_counter() - started
out = ext.scaled_add(torch.arange(6.0), torch.ones(6), 0.5)
print("RESULT " + json.dumps({"first_call_s": load_s, "out": [round(v, 5) for v in out.tolist()]}))
