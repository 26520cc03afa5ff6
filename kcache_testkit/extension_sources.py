"""Extension sources in a dir of their own, a header beside the source (``#include "kc_scale.h"``),
as a user's checkout holds them: what tests/test_jit_headers.py builds with torch's
``cpp_extension.load`` and tvm-ffi's ``tvm_ffi.cpp.load`` to show that the ``jit`` key follows the
header's content, not its path."""

from __future__ import annotations

from pathlib import Path

HEADER = "kc_scale.h"
# torch: a plain library (``load(..., is_python_module=False)``: torch loads it with
# torch.ops.load_library), no torch header: a build of a second or two, where one that includes
# <torch/extension.h> takes minutes on a loaded 2-core machine; the flags and link are torch's.
TORCH_SOURCE = """#include "kc_scale.h"

extern "C" double kc_scaled_add(double x, double y) { return x + SCALE * y; }
"""
# tvm-ffi: add_scaled(a, b) = a + SCALE * b, exported with tvm-ffi's macro.
TVM_FFI_SOURCE = """#include <tvm/ffi/function.h>
#include "kc_scale.h"

int64_t add_scaled(int64_t a, int64_t b) { return a + static_cast<int64_t>(SCALE) * b; }

TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_scaled, add_scaled);
"""


def write_sources(directory: Path, source: str, scale: int) -> Path:
    """``directory/ext.cpp`` and its header ``kc_scale.h`` (``SCALE``: ``scale``); the dir."""
    (directory / "include").mkdir(parents=True, exist_ok=True)
    (directory / "ext.cpp").write_text(source)
    # The header includes one more: the scan follows includes through headers too.
    (directory / HEADER).write_text('#pragma once\n#include "include/kc_value.h"\n#define SCALE KC_VALUE\n')
    (directory / "include" / "kc_value.h").write_text(f"#pragma once\n#define KC_VALUE {scale}\n")
    return directory
