"""A fresh CPU node's first ``torch.compile`` call: cold vs warm from kcache vs copied-warm (issue 29).

Inductor's CPU backend compiles each graph's kernels into a C++ module (and, on a fresh node, its
ISA probe libraries); the FX-graph entry kcache serves carries the source, not the module. With
the ``jit`` layer a fresh node gets the modules too. Every node is a fresh interpreter with its
own ``HOME`` and ``TMPDIR`` (``kcache_testkit.nodes.Node``), the job is
``kcache_testkit/cpu_jit_job.py`` (a two-layer MLP), and every compiler run is recorded by a
``PATH`` shim:

* **cold**: node A, kcache on (``KCACHE_URL`` and a workload), empty caches: compiles, uploads.
* **kcache-warm**: a fresh node, kcache on, same workload: gets A's entries (FX graph, modules).
* **copied-warm**: a fresh node with A's Inductor cache dir copied in, kcache off: what users
  do today, and the honest baseline for a fleet cache.

kcache-warm and copied-warm are repeated (fresh nodes each time, alternating) and their medians
compared in the same run. Target: kcache-warm / copied-warm ≤ 1.1.

    python -m bench.cpu_jit [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any

from bench import common
from kcache_testkit.cpu_jit import JobRun, copy_warm, run_job
from kcache_testkit.nodes import Node

TARGET = 1.1


def _row(name: str, runs: list[JobRun]) -> dict[str, Any]:
    times = [r.first_call_s for r in runs]
    return {"name": name, "first_call_s": times, "median_s": common.median(times),
            "compiler_runs": [len(r.calls) for r in runs], "compiler_builds": [len(r.builds) for r in runs]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    root = common.tmp_root("cpu-jit-")
    try:
        with common.kcache_service(root / "service") as url:
            fleet = {"KCACHE_URL": url, "KCACHE_WORKLOAD": "cpu-jit"}
            node_a = Node(root / "a")
            cold = run_job(node_a, **fleet)
            warm: list[JobRun] = []
            copied: list[JobRun] = []
            for i in range(args.repeats):
                for kind in (("kcache", "copied") if i % 2 == 0 else ("copied", "kcache")):
                    node = Node(root / f"{kind}-{i}")
                    if kind == "kcache":
                        warm.append(run_job(node, **fleet))
                    else:
                        copy_warm(node_a, node)
                        copied.append(run_job(node))
                    if any(r.out != cold.out for r in (*warm, *copied)):
                        raise SystemExit("a warm node's output differs from the cold node's")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [_row("cold", [cold]), _row("kcache-warm", warm), _row("copied-warm", copied)]
    ratio = rows[1]["median_s"] / rows[2]["median_s"]
    print(f"\nfirst torch.compile call, CPU (s; median of {args.repeats} fresh nodes for the warm kinds)")
    print(f"  {'node':<14}{'median':>9}  {'runs':<40}compiler runs (builds)")
    for row in rows:
        runs = ", ".join(f"{t:.2f}" for t in row["first_call_s"])
        calls = ", ".join(f"{c} ({b})" for c, b in zip(row["compiler_runs"], row["compiler_builds"], strict=True))
        print(f"  {row['name']:<14}{row['median_s']:>9.2f}  {runs:<40}{calls}")
    print(f"\nkcache-warm / copied-warm = {ratio:.2f}  (target <= {TARGET}: {common.verdict(ratio <= TARGET)})")
    print(f"cold / kcache-warm        = {rows[0]['median_s'] / rows[1]['median_s']:.1f}x")
    result = {"machine": common.machine(), "repeats": args.repeats, "rows": rows, "ratio_kcache_warm_to_copied_warm": ratio, "target": TARGET}
    common.write_result("cpu_jit", result)
    return result


if __name__ == "__main__":
    main()

