"""Reading one large FX-graph entry: Inductor's JSON form vs kcache's raw-pickle envelope.

The entry is shaped like a max-autotune graph: a pickle dominated by kernel binaries (the
TritonBundle rides inside it). Per form, what a warm node does between "bytes arrived" and "graph
object in hand":

* Inductor's form (``json.dumps({"data": base64(pickle), ...})``): ``json.loads``, ``b64decode``,
  ``pickle.loads`` — what ``FxGraphCache.iterate_over_candidates`` does with a remote hit;
* kcache's envelope (:mod:`kcache.store.fx_graph_envelope`): slice out the pickle, ``pickle.loads``;
* a local hit (Inductor's own disk cache): ``pickle.loads`` of the file's bytes — the floor.

Prints medians, stored sizes, and the ratios to a local read. Target: the envelope reads >= 3x
faster than Inductor's JSON form (the baseline it replaces). What stays above a local read is one
copy of the pickle out of the received buffer (Inductor needs it as its own ``bytes``).

    python -m bench.fx_entry_read [--mb 180] [--repeats 5]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import common


def _graph_like(total_mb: int) -> dict[str, Any]:
    """Kernel binaries (incompressible, ~90 KB each like cubins) plus some small Python state."""
    n = max(1, total_mb * 1_000_000 // 90_000)
    return {
        "kernels": [{"name": f"triton_k{i}", "cubin": os.urandom(90_000), "meta": {"num_warps": 4}} for i in range(n)],
        "source_code": "def call(args):\n    pass\n" * 2000,
    }


def _median_s(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return common.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fx_entry_read", description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=180, help="pickle size in MB (GPT-2 6L max-autotune: 180)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    from kcache.store import fx_graph_envelope as fx

    content = pickle.dumps(_graph_like(args.mb))
    inductor_json = json.dumps({"data": base64.b64encode(content).decode("ascii"), "time_taken_ms": 61536}).encode()
    envelope = fx.encode(inductor_json)
    assert envelope is not None and fx.pickled_graph(envelope) == content

    def read_inductor_json() -> Any:
        return pickle.loads(base64.b64decode(json.loads(inductor_json)["data"]))

    local_s = _median_s(lambda: pickle.loads(content), args.repeats)
    json_s = _median_s(read_inductor_json, args.repeats)
    envelope_s = _median_s(lambda: pickle.loads(fx.pickled_graph(envelope)), args.repeats)
    encode_s = _median_s(lambda: fx.encode(inductor_json), args.repeats)

    ok = json_s >= 3 * envelope_s
    print(f"pickle {len(content) / 1e6:.1f} MB; stored: Inductor JSON {len(inductor_json) / 1e6:.1f} MB, envelope {len(envelope) / 1e6:.1f} MB")
    print(f"read, median of {args.repeats}: local pickle {local_s * 1e3:.0f} ms | Inductor JSON {json_s * 1e3:.0f} ms "
          f"({json_s / local_s:.2f}x local) | envelope {envelope_s * 1e3:.0f} ms ({envelope_s / local_s:.2f}x local)")
    print(f"envelope vs Inductor JSON: {json_s / envelope_s:.2f}x faster; one-time encode at upload {encode_s * 1e3:.0f} ms")
    print(f"target envelope >= 3x faster than Inductor JSON: {common.verdict(ok)}")
    common.write_result("fx_entry_read", {
        "machine": common.machine(),
        "pickle_bytes": len(content), "inductor_json_bytes": len(inductor_json), "envelope_bytes": len(envelope),
        "local_read_s": local_s, "inductor_json_read_s": json_s, "envelope_read_s": envelope_s, "encode_s": encode_s,
        "envelope_vs_local": envelope_s / local_s, "json_vs_local": json_s / local_s, "target_met": ok,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
