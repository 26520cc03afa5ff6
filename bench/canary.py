"""What the key-soundness canary costs a warm CPU node's first ``torch.compile`` call (issue 30).

Every node is a fresh interpreter with its own ``HOME`` and ``TMPDIR`` (``kcache_testkit.nodes``),
the job is ``kcache_testkit/cpu_jit_job.py`` (a two-layer MLP), kcache on through ``KCACHE_URL``:

* **cold**: node A compiles everything and uploads it (the compile a sampled hit repeats);
* **warm**: a fresh node served A's entries, ``KCACHE_CANARY`` unset (the baseline);
* **canary-off**: the same with ``KCACHE_CANARY=0``: what every node pays while the canary is off;
* **canary-all**: ``KCACHE_CANARY=1``: every FX-graph hit is compiled again and compared (the
  audits are counted from the node's stats; the C++ modules of its own compile are ``jit`` hits
  when the code agrees, so an audit costs Inductor's lowering and code generation, not gcc).

Besides the first call's time (noisy here: a shared machine), each node's own timers of Inductor
compiling a graph (``GraphLowering.run`` + ``GraphLowering.compile_to_fn``, from its stats'
phases) say what the audits cost: 0 on a warm node, one compile per audited hit with the canary.

The warm kinds alternate over ``--repeats`` fresh nodes; medians are compared in the same run.
Targets: canary-off / warm <= 1.05 (nothing but noise), and canary-all's Inductor compile time
per audited hit at most the cold node's (one compile per sampled hit, no more). A fleet at
``KCACHE_CANARY=0.01`` pays that extra on one hit in a hundred.

    python -m bench.canary [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any

from bench import common
from kcache_testkit.cpu_jit import JobRun, run_job
from kcache_testkit.nodes import Node

OFF_TARGET = 1.05
KINDS = {"warm": {}, "canary-off": {"KCACHE_CANARY": "0"}, "canary-all": {"KCACHE_CANARY": "1"}}


# torch's own timers of Inductor compiling a graph: lowering, then code generation and loading
# the module (with its C++ build: gcc on the cold node; a jit hit on an audit whose code agrees),
# from the node's stats. A hit runs neither: on a warm node they read 0.
COMPILE_TIMERS = ("GraphLowering.run", "GraphLowering.compile_to_fn")
CODEGEN = "Inductor compile"


def _codegen_s(run: JobRun) -> float:
    phases = run.stats.get("phases", {})
    return sum(float(phases.get(name, 0.0)) for name in COMPILE_TIMERS)


def _audits(run: JobRun) -> int:
    verification: dict[str, dict[str, int]] = run.stats.get("verification", {})
    return sum(verification.get("audited", {}).values()) + sum(verification.get("unsound", {}).values())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    root = common.tmp_root("canary-")
    runs: dict[str, list[JobRun]] = {kind: [] for kind in KINDS}
    try:
        with common.kcache_service(root / "service") as url:
            cold = run_job(Node(root / "a"), KCACHE_URL=url)
            order = list(KINDS)
            for i in range(args.repeats):
                for kind in order[i % len(order):] + order[: i % len(order)]:  # rotate: no kind always first
                    run = run_job(Node(root / f"{kind}-{i}"), KCACHE_URL=url, **KINDS[kind])
                    if run.out != cold.out:
                        raise SystemExit(f"a {kind} node's output differs from the cold node's")
                    runs[kind].append(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {kind: common.median([r.first_call_s for r in rs]) for kind, rs in runs.items()}
    audits = [_audits(r) for r in runs["canary-all"]]
    unsound = sum(sum(r.stats.get("verification", {}).get("unsound", {}).values()) for r in runs["canary-all"])
    per_audit = (med["canary-all"] - med["warm"]) / max(1, common.median(audits))
    codegen = {kind: common.median([_codegen_s(r) for r in rs]) for kind, rs in runs.items()}
    codegen_per_audit = (codegen["canary-all"] - codegen["warm"]) / max(1, common.median(audits))
    off_ratio = med["canary-off"] / med["warm"]
    print(f"\nfirst torch.compile call, CPU (s; median of {args.repeats} fresh nodes per warm kind)")
    print(f"  {'node':<12}{'median':>9}{CODEGEN:>24}  runs")
    print(f"  {'cold':<12}{cold.first_call_s:>9.2f}{_codegen_s(cold):>24.2f}  {cold.first_call_s:.2f}")
    for kind, rs in runs.items():
        print(f"  {kind:<12}{med[kind]:>9.2f}{codegen[kind]:>24.2f}  " + ", ".join(f"{r.first_call_s:.2f}" for r in rs))
    print(f"\ncanary-off / warm = {off_ratio:.2f}  (target <= {OFF_TARGET}: {common.verdict(off_ratio <= OFF_TARGET)})")
    print(f"canary-all / warm = {med['canary-all'] / med['warm']:.2f}; audited hits per node {audits} (unsound: {unsound})")
    print(f"extra per audited hit = {per_audit:.2f} s of first call (noise included); Inductor compile per audited hit "
          f"= {codegen_per_audit:.2f} s vs the cold node's {_codegen_s(cold):.2f} s "
          f"(target: at most one compile: {common.verdict(codegen_per_audit <= _codegen_s(cold) * 1.25 and per_audit <= cold.first_call_s)})")
    print(f"at KCACHE_CANARY=0.01 a warm node pays {0.01 * max(per_audit, codegen_per_audit) * 1000:.0f} ms per FX-graph hit on average")
    result = {
        "machine": common.machine(), "repeats": args.repeats, "cold_s": cold.first_call_s,
        "first_call_s": {kind: [r.first_call_s for r in rs] for kind, rs in runs.items()}, "median_s": med,
        "audits_per_node": audits, "unsound": unsound, "ratio_off_to_warm": off_ratio,
        "ratio_all_to_warm": med["canary-all"] / med["warm"], "extra_s_per_audit": per_audit, "off_target": OFF_TARGET,
        "codegen_median_s": codegen, "cold_codegen_s": _codegen_s(cold), "codegen_s_per_audit": codegen_per_audit,
    }
    common.write_result("canary", result)
    return result


if __name__ == "__main__":
    main()
