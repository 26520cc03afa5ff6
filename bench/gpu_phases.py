"""Where a node's first ``torch.compile`` call went, per scenario: issue 26's breakdown.

Reads the result files of ``bench/gpu_e2e.py`` (each run there records torch's own phase timers,
``dynamo_timed`` -> ``compilation_time_metrics``, its start-up split and kcache's per-layer stats)
and prints, per workload, one row per phase and one column per scenario: the median over the
scenario's runs (the first and its repeats), then the kcache-warm minus copied-warm and minus
local-warm differences, so a gap between a fresh kcache node and a node whose dirs were copied by
hand is pinned on a phase. The rows nest as torch's timers do:

    first call = compile wrapping (a precompile package loads here)
               + Dynamo (``_compile.compile_inner``: tracing, the backend, guards)
               + running the compiled step (kernel loads, CUDA's JIT, autotuning at run time,
                 CUDA-graph recording: what no timer covers)

    python bench/gpu_phases.py bench/results/gpu/h200/gpu_e2e_k26a.json [...] [--out phases.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

Run = dict[str, Any]
SCENARIOS = ("kcache-warm", "copied-warm", "local-warm", "kcache-warm-precompile", "copied-warm-precompile")


def _phase(name: str) -> Callable[[Run], float]:
    return lambda run: float((run.get("phases") or {}).get(name, [0.0])[0])


def _phases_containing(needle: str) -> Callable[[Run], float]:
    return lambda run: sum(float(v[0]) for k, v in (run.get("phases") or {}).items() if needle in k)


def _startup(name: str) -> Callable[[Run], float]:
    return lambda run: float((run.get("startup") or {}).get(name, 0.0))


def _kcache_layers(run: Run) -> float:
    layers = ((run.get("kcache") or {}).get("layers")) or {}
    return sum(float(v.get("seconds", 0.0)) for v in layers.values())


def _call_cpu(name: str, index: int | None = None) -> Callable[[Run], float]:
    def read(run: Run) -> float:
        value = (run.get("call_cpu") or {}).get(name, 0.0)  # bench/first_call_probe.py
        return float((value[index] if index is not None else value) or 0.0)  # None: no pool yet

    return read


def _call_waiting(run: Run) -> float:
    cpu = run.get("call_cpu") or {}
    return float(cpu.get("wall_s", 0.0)) - float(cpu.get("main_thread_cpu_s", 0.0))


def _running(run: Run) -> float:
    return float(run["first_call_s"]) - float(run.get("compile_wrap_s", 0.0)) - _phase("_compile.compile_inner")(run)


# (label, indent, how to read it from one run)
ROWS: tuple[tuple[str, int, Callable[[Run], float]], ...] = (
    ("first call", 0, lambda run: float(run["first_call_s"])),
    # The collector's full collections come when the heap has grown by a quarter since the last
    # one: a few thousand objects more or less before the call (any import) move one into or out
    # of it, on every run of the workload alike. This row is the call without that luck.
    ("first call, less the garbage collector", 0, lambda run: float(run["first_call_s"]) - _call_cpu("gc_s")(run)),
    ("compile wrapping (package load)", 1, lambda run: float(run.get("compile_wrap_s", 0.0))),
    ("Dynamo, all frames (compile_inner)", 1, _phase("_compile.compile_inner")),
    ("bytecode tracing", 2, _phase("bytecode_tracing")),
    ("backend (call_user_compiler)", 2, _phase("OutputGraph.call_user_compiler")),
    ("AOTAutograd cache: Inductor load", 3, _phase("AOTAutogradCache.inductor_load")),
    ("AOTAutograd trace (a miss)", 3, _phase("create_aot_dispatcher_function")),
    ("PyCodeCache.load_by_key_path", 3, _phase("PyCodeCache.load_by_key_path")),
    ("TritonBundler.read_and_emit", 3, _phase("TritonBundler.read_and_emit")),
    ("async_compile.wait", 3, _phase("async_compile.wait")),
    ("build_guards", 2, _phase("build_guards")),
    ("running the step (no timer)", 1, _running),
    ("coordinate-descent tuning", 2, _phases_containing("coordinate_descent")),
    ("static autotuner warm-up", 2, _phase("StaticAutotunerFuture.warm_precompile")),
    ("the call's main thread: CPU", 1, _call_cpu("main_thread_cpu_s")),
    ("garbage collector", 2, _call_cpu("gc_s")),
    ("full collections (count)", 3, _call_cpu("gc_collections", 2)),
    ("the call's main thread: not on a CPU (waiting)", 1, _call_waiting),
    ("involuntary context switches (count)", 2, _call_cpu("main_thread_involuntary_switches")),
    ("voluntary context switches (count)", 2, _call_cpu("main_thread_voluntary_switches")),
    ("the process's other threads: CPU", 1, _call_cpu("other_threads_cpu_s")),
    ("objects the collector tracks at the call (count)", 1, _call_cpu("gc_objects_at_start")),
    ("load average at the call", 1, _call_cpu("loadavg_at_start")),
    ("compile pool ready when the call started (1 = yes)", 1, _call_cpu("compile_pool_ready", 0)),
    ("compile pool ready when the call ended (1 = yes)", 1, _call_cpu("compile_pool_ready", 1)),
    ("kcache: all layers' own seconds", 0, _kcache_layers),
    ("kcache: kernel emit", 0, lambda run: float((run.get("kcache") or {}).get("bundle_emit_s") or 0.0)),
    ("kcache: kernels pre-emitted (background, count)", 0,
     lambda run: float((((run.get("kcache") or {}).get("pre_emit") or {}).get("emitted")) or 0)),
    ("kcache: workload prefetch (background)", 0, lambda run: float(((run.get("kcache") or {}).get("prefetch") or {}).get("seconds") or 0.0)),
    ("start-up: import torch", 0, _startup("import_torch_s")),
    ("start-up: import Dynamo + Inductor (kcache activates)", 0, _startup("import_dynamo_inductor_s")),
    ("exit after the first call", 0, lambda run: float(run.get("exit_s") or 0.0)),
)


def runs_of(workload: dict[str, Any], scenario: str) -> list[Run]:
    """The scenario's first run and its repeats that reported (a failed run has no report)."""
    runs = workload.get("runs", {})
    first = runs.get(scenario)
    repeats = runs.get(f"{scenario}-repeat-reports") or []
    return [r for r in [first, *repeats] if isinstance(r, dict) and "first_call_s" in r]


def table(name: str, workload: dict[str, Any]) -> str:
    present = [s for s in SCENARIOS if runs_of(workload, s)]
    if not present:
        return ""
    diffs = [(f"kc - {base.split('-')[0]}", base) for base in ("copied-warm", "local-warm") if "kcache-warm" in present and base in present]
    head = ["phase (median s)", *[f"{s} (n={len(runs_of(workload, s))})" for s in present], *[d for d, _ in diffs]]
    lines = [f"### {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, indent, read in ROWS:
        medians = {s: statistics.median(read(r) for r in runs_of(workload, s)) for s in present}
        if all(abs(v) < 0.0005 for v in medians.values()):
            continue
        cells = [f"{medians[s]:.3f}" for s in present]
        cells += [f"{medians['kcache-warm'] - medians[base]:+.3f}" for _, base in diffs]
        lines.append("| " + "&nbsp;" * 4 * indent + label + " | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", type=Path, help="gpu_e2e result files (.json)")
    p.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    args = p.parse_args()
    parts = []
    for path in args.results:
        doc = json.loads(path.read_text())
        device = (doc.get("environment") or {}).get("gpu") or ""
        for name, workload in doc.get("workloads", {}).items():
            text = table(f"{name} ({path.name}{', ' + device if device else ''})", workload)
            if text:
                parts.append(text)
    out = "\n".join(parts)
    print(out)
    if args.out:
        args.out.write_text(out)


if __name__ == "__main__":
    main()
