"""A "job" for the fleet tests, run as a fresh process (a fresh node).

kcache activates itself from the environment (the .pth hook): KCACHE_URL, KCACHE_WORKLOAD, ...
It compiles a few real Triton kernels (through Triton's cache manager) and one torch.compile'd
function on the CPU (through Inductor's FX-graph and AOTAutograd caches), then prints JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

T0 = time.perf_counter()

from kcache.current import get_runtime  # noqa: E402

from kcache_testkit.pace import HANG_S  # noqa: E402

report: dict[str, object] = {}
if os.environ.get("KCACHE_WORKLOAD") and os.environ.get("PROBE_PREFETCH") == "1":
    # Observe the prefetcher before anything asks for a kernel or an entry.
    deadline = time.monotonic() + HANG_S  # hang guards: a loaded machine starts and prefetches slower
    while get_runtime() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    rt = get_runtime()
    assert rt is not None and rt.prefetcher is not None
    rt.prefetcher.done.wait(HANG_S)
    view = rt.prefetcher.view
    promised = view.kernels if view is not None else []
    report["prefetched_kernels"] = sorted(k for k in promised if rt.local.get("kernel", k) is not None)
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    report["triton_dirs_before_compile"] = sorted(p.name for p in cache.iterdir()) if cache.exists() else []
    report["prefetch_counts"] = rt.prefetcher.counts
    report["prefetch_done_at_s"] = time.perf_counter() - T0

if os.environ.get("FORBID_FX_GRAPH_JSON") == "1":
    # Prove a remote FX-graph hit is unpickled straight from kcache's envelope: Inductor's JSON
    # form of the entry cannot be produced in this process.
    import kcache.store.fx_graph_envelope as fx_entries

    _to_json = fx_entries.inductor_json

    def _no_json(stored: bytes) -> bytes:
        if stored.startswith(fx_entries.MAGIC):
            raise AssertionError("FX-graph entry went through Inductor's JSON path")
        return _to_json(stored)  # other layers' entries are Inductor's JSON as stored

    fx_entries.inductor_json = _no_json

import torch  # noqa: E402
import triton  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from kcache_testkit.corpus import compile_small  # noqa: E402

hits: list[bool] = []
triton.knobs.compilation.listener = lambda *, cache_hit=False, **_: hits.append(cache_hit)
kernel_dirs = compile_small(os.environ["TRITON_CACHE_DIR"], count=int(os.environ.get("N_KERNELS", "3")))
triton.knobs.compilation.listener = None


def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ y).sum(dim=-1) * 2 + x.mean()


torch.manual_seed(0)
x, y = torch.randn(64, 64), torch.randn(64, 64)
t = time.perf_counter()
out = torch.compile(f)(x, y)
compile_s = time.perf_counter() - t

rt = get_runtime()
if rt is not None:
    rt.close()  # flush uploads and publish the workload now, so the report can include stats
report.update(
    kernel_keys=[d.name for d in kernel_dirs],
    triton_cache_hits=hits,
    fx=dict(counters["inductor"]),
    aot=dict(counters["aot_autograd"]),
    stats={name: c.model_dump() for name, c in rt.stats.snapshot().items()} if rt else None,
    compile_s=compile_s,
    out=out.tolist(),
)
print("REPORT " + json.dumps(report))
