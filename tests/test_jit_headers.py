"""An extension's key follows the headers its sources include (kcache.layers.jit.headers), end to end:
sources in a user's checkout (``kcache_testkit/extension_sources.py``: ``ext.cpp`` includes
``kc_scale.h`` beside it, which includes ``include/kc_value.h``), built by torch's
``cpp_extension.load`` and by tvm-ffi's ``tvm_ffi.cpp.load``. Node A builds; node B (another
``HOME``, another checkout path, the same content) runs no compiler and gets A's result; node C
(the same sources and flags, one edited header) misses, builds, and gets its own result — before
headers were hashed, C was served A's library and computed with A's header."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kcache_testkit.cpu_jit import EXTENSION_JOB, TVM_FFI_JOB, JobRun, run_job  # noqa: E402
from kcache_testkit.extension_sources import TORCH_SOURCE, TVM_FFI_SOURCE, write_sources  # noqa: E402
from kcache_testkit.nodes import Node  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.skipif(shutil.which("ninja") is None, reason="the extension JITs need ninja"),
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from live import LiveService

    with LiveService(tmp_path_factory.mktemp("header-service")) as live:
        yield live


def _run(root: Path, job: Path, source: str, scale: int, url: str) -> JobRun:
    node = Node(root)
    sources = write_sources(root / "checkout" / "ext", source, scale)
    return run_job(node, job=job, KCACHE_URL=url, EXTENSION_SOURCE_DIR=str(sources))


@pytest.mark.parametrize("builder", ["torch", "tvm-ffi"])
def test_an_edited_header_is_a_miss_and_the_same_header_elsewhere_a_hit(builder: str, service: Any, tmp_path: Path) -> None:
    if builder == "tvm-ffi":
        pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed (it is in the dev extra)")
    job, source = (EXTENSION_JOB, TORCH_SOURCE) if builder == "torch" else (TVM_FFI_JOB, TVM_FFI_SOURCE)
    a = _run(tmp_path / "a", job, source, 2, service.url)
    assert a.builds and a.layer("jit")["puts"] == 1, a.layer("jit")

    b = _run(tmp_path / "elsewhere" / "b", job, source, 2, service.url)
    assert b.builds == [], b.builds
    assert b.out == a.out and b.layer("jit")["hits"] == 1

    c = _run(tmp_path / "c", job, source, 3, service.url)
    assert c.layer("jit")["hits"] == 0 and c.layer("jit")["misses"] == 1, c.layer("jit")
    assert any("-shared" in call for call in c.builds), "the edited header is built"
    assert c.out != a.out  # computed with C's header, not A's
    print(f"\n{builder} load with a header (s): A {a.first_call_s:.2f} ({len(a.builds)} builds), "
          f"B {b.first_call_s:.3f} ({len(b.builds)} builds, {len(b.calls)} probes), C {c.first_call_s:.2f} ({len(c.builds)} builds)")
