"""A user's job that builds a tvm-ffi module (``apache-tvm-ffi``: FlashInfer's JIT builder), run as
a fresh interpreter on a node (:class:`kcache_testkit.nodes.Node`; kcache only through
``KCACHE_URL``): ``tvm_ffi.cpp.load_inline`` by default, ninja-built in ``~/.cache/tvm-ffi/...``
under the node's ``HOME``; with ``EXTENSION_SOURCE_DIR`` set, ``tvm_ffi.cpp.load`` of that dir's
``ext.cpp`` (kcache_testkit/extension_sources.py: a source that includes a header beside it).
Prints ``RESULT <json>``: the seconds the build-and-load took and what the module computed."""

from __future__ import annotations

import json
import os
import time

import tvm_ffi.cpp

SOURCE = """
int64_t add_scaled(int64_t a, int64_t b) { return a + 3 * b; }
"""

started = time.perf_counter()
source_dir = os.environ.get("EXTENSION_SOURCE_DIR")
if source_dir:
    module = tvm_ffi.cpp.load(name="kcache_tvm_header", sources=[os.path.join(source_dir, "ext.cpp")])
else:
    module = tvm_ffi.cpp.load_inline(name="kcache_tvm_add", cpp_sources=SOURCE, functions=["add_scaled"])
load_s = time.perf_counter() - started
out = [float(module.add_scaled(2, 5)), float(module.add_scaled(-1, 4))]
print("RESULT " + json.dumps({"first_call_s": load_s, "out": out}))
