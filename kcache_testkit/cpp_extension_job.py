"""A user's job that builds a torch C++ extension with ``torch.utils.cpp_extension.load_inline``
(ninja, in ``~/.cache/torch_extensions/...`` under the node's ``HOME``), run as a fresh interpreter
on a node (:class:`kcache_testkit.nodes.Node`; kcache only through ``KCACHE_URL``); with
``EXTENSION_SOURCE_DIR`` set, ``cpp_extension.load`` of that dir's ``ext.cpp`` as a plain library
(kcache_testkit/extension_sources.py: a source that includes a header beside it). Prints
``RESULT <json>``: the seconds the build-and-load took and what the extension computed."""

from __future__ import annotations

import ctypes
import json
import os
import time

import torch
from torch.utils.cpp_extension import load, load_inline

SOURCE = """
torch::Tensor scaled_add(torch::Tensor x, torch::Tensor y, double alpha) {
  return x + alpha * y;
}
"""

started = time.perf_counter()
source_dir = os.environ.get("EXTENSION_SOURCE_DIR")
if source_dir:
    path = load(name="kcache_scaled_header", sources=[os.path.join(source_dir, "ext.cpp")], is_python_module=False)
    load_s = time.perf_counter() - started
    scaled_add = ctypes.CDLL(path).kc_scaled_add
    scaled_add.restype, scaled_add.argtypes = ctypes.c_double, [ctypes.c_double, ctypes.c_double]
    out = torch.tensor([scaled_add(float(i), 1.0) for i in range(6)])
else:
    ext = load_inline(name="kcache_scaled_add", cpp_sources=[SOURCE], functions=["scaled_add"])  # type: ignore[no-untyped-call]
    load_s = time.perf_counter() - started
    out = ext.scaled_add(torch.arange(6.0), torch.ones(6), 0.5)
print("RESULT " + json.dumps({"first_call_s": load_s, "out": [round(v, 5) for v in out.tolist()]}))
