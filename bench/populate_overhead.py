"""What a populating node pays for kcache: a fresh node that compiles and uploads vs the same node
with kcache off (issue 26: populate <= 1.05x cold).

The job (``--job``, a fresh interpreter on its own :class:`kcache_testkit.nodes.Node`: own
``HOME`` and ``TMPDIR``, kcache only through ``KCACHE_URL``) is shaped like a max-autotune compile,
the workload where a GPU populate measured 1.13-1.31x cold, on the CPU:

* a ``torch.compile`` of a model with graph breaks (Inductor's CPU backend: FX-graph and
  AOTAutograd entries, a C++ module per graph through the ``jit`` layer);
* ``--kernels`` real Triton kernels compiled for sm_90 through Triton's cache manager (kcache's
  tiered one when active), half one after another on the main thread (as coordinate descent
  does), half on a pool of 4 threads (as ``select_algorithm``'s precompile does): every one a
  kernel lookup that misses, a miss recorded, a kernel dir uploaded;
* ``--autotune`` lookups and saves through Inductor's real ``AutotuneCache`` (autotune entries).

Scenarios, interleaved (a round runs each once, the order rotating), medians of ``--runs``:

* **cold**: kcache off (no ``KCACHE_URL``).
* **populate**: kcache on against a real ``kcache serve``, an empty cache (a new namespace per
  run), this checkout's client.
* **populate-NAME** (``--base NAME=DIR``, repeatable): the same with the client of another
  checkout (the code before a change), so before/after is measured in one run against one
  baseline.

Per run: the job's compile seconds (its in-process timer around the work: what a user waits for
before the first result), the process's wall time and its exit (the upload flush), kcache's own
timers (the stats document's per-layer seconds), the CPU seconds kcache's uploader thread had
used by the end of the work (what it took from the compile: the GIL, a core) and what was
uploaded or lost (``put_errors`` must be 0). ``--profile SCENARIO`` makes one more run of it
under cProfile (the main thread: the compile path) and lists the kcache frames with the most
cumulative time.

    python -m bench.populate_overhead [--runs 5] [--kernels 40] [--autotune 60] [--base NAME=DIR] [--profile SCENARIO]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from kcache_testkit.nodes import Node

TARGET = 1.05
RESULT = "RESULT "
TRITON_ENV = {"TRITON_DEFAULT_FP_FUSION": "1"}  # one Triton key for every run (see kcache_testkit.corpus)


# ---- the job (a fresh interpreter) ------------------------------------------------------------


def _torch_part(graphs: int) -> list[float]:
    import torch

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)) for _ in range(graphs)
    )

    def forward(x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(blocks):
            x = block(x)
            if i < graphs - 1:
                torch._dynamo.graph_break()  # one FX graph (and one C++ module) per block
        return x

    out = torch.compile(forward)(torch.randn(8, 64))
    return [round(v, 4) for v in out.flatten().tolist()[:8]]


def _triton_part(kernels: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import triton

    from kcache_testkit.corpus import corpus_specs

    specs = corpus_specs(kernels, archs=(90,))

    def compile_one(spec: Any) -> None:
        triton.compile(spec.source(), target=spec.target(), options=spec.options())

    half = len(specs) // 2
    for spec in specs[:half]:  # one after another on the main thread, as coordinate descent does
        compile_one(spec)
    with ThreadPoolExecutor(4) as pool:  # side by side, as select_algorithm's precompile does
        list(pool.map(compile_one, specs[half:]))


def _autotune_part(count: int) -> None:
    import torch._inductor.codecache  # noqa: F401  (Inductor in use)
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from torch._inductor.runtime.triton_compat import Config
    from torch._inductor.runtime.triton_heuristics import check_autotune_cache

    meta = {"autotune_local_cache": True, "autotune_remote_cache": True, "backend_hash": "cpu-bench-backend",
            "coordinate_descent_tuning": False, "is_fbcode": False}
    configs = [Config({"XBLOCK": 64}, num_warps=2), Config({"XBLOCK": 256}, num_warps=8)]
    for i in range(count):
        name = f"c{i:03d}populatebenchkernel{i:040d}"[:52] + ".py"
        path = os.path.join(cache_dir(), name[1:3], name)
        _found, cache, info = check_autotune_cache(configs, path, meta)
        if info.get("autotune_cache_state") == "miss" and cache is not None:
            cache.save(configs[i % 2], time_taken_ns=3_000_000)  # "benchmarked"


def _thread_cpu_s(name: str) -> float | None:
    """CPU seconds the thread called ``name`` has used so far (Linux), None where unknown."""
    import threading

    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            try:
                fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                return None
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return None


def job(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    import torch  # noqa: F401  (imported before the clock starts: not what kcache changes)
    import triton  # noqa: F401

    import_s = time.perf_counter() - started
    profiler = None
    if args.profile_out:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    out = _torch_part(args.graphs)
    t1 = time.perf_counter()
    _triton_part(args.kernels)
    t2 = time.perf_counter()
    _autotune_part(args.autotune)
    t3 = time.perf_counter()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile_out)
    print(RESULT + json.dumps({"compile_s": t3 - t0, "torch_s": t1 - t0, "triton_s": t2 - t1, "autotune_s": t3 - t2,
                               "import_s": import_s, "uploader_cpu_s": _thread_cpu_s("kcache-uploader"),
                               "main_cpu_s": time.thread_time(), "work_done_at": time.time(), "out": out}), flush=True)


# ---- the driver -------------------------------------------------------------------------------


def _client_path(checkout: Path) -> str:
    """kcache from ``checkout`` first; this benchmark (``bench``) from this one."""
    return os.pathsep.join([*(str(checkout / p) for p in ("client", "schemas", "service", ".")), str(common.REPO)])


def run_one(root: Path, scenario: str, k: int, url: str, args: argparse.Namespace, profile: Path | None = None) -> dict[str, Any]:
    node = Node(root / f"{scenario}-{k}")
    settings = dict(TRITON_ENV)
    checkout = Path(args.bases[scenario]) if scenario in args.bases else common.REPO
    settings["PYTHONPATH"] = _client_path(checkout)
    stats_file = node.root / "stats.json"
    if scenario != "cold":
        settings |= {"KCACHE_URL": url, "KCACHE_WORKLOAD": "populate-bench", "KCACHE_NAMESPACE": f"{scenario}-{k}-{os.getpid()}",
                     "KCACHE_STATS_FILE": str(stats_file), "KCACHE_FLUSH_TIMEOUT_S": "120"}
    cmd = [sys.executable, "-m", "bench.populate_overhead", "--job", "--graphs", str(args.graphs),
           "--kernels", str(args.kernels), "--autotune", str(args.autotune)]
    if profile is not None:
        cmd += ["--profile-out", str(profile)]
    load = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run(cmd, env=node.env(**settings), cwd=common.REPO, capture_output=True, text=True, timeout=1800)
    ended = time.time()
    result = next((json.loads(line[len(RESULT):]) for line in proc.stdout.splitlines() if line.startswith(RESULT)), None)
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"{scenario} run {k} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    row: dict[str, Any] = {"scenario": scenario, "round": k, "compile_s": round(result["compile_s"], 3),
                           "parts_s": {p: round(result[f"{p}_s"], 3) for p in ("torch", "triton", "autotune")},
                           "process_s": round(ended - t0, 3), "exit_s": round(ended - result["work_done_at"], 3),
                           "loadavg_1m_at_start": round(load, 2), "out": result["out"],
                           "uploader_cpu_s": result["uploader_cpu_s"], "main_cpu_s": round(result["main_cpu_s"], 3),
                           "kcache_stderr": [ln for ln in proc.stderr.splitlines() if ln.startswith("kcache:")][:10]}
    if stats_file.exists():
        layers = json.loads(stats_file.read_text()).get("layers", {})
        row["kcache_seconds"] = round(sum(v.get("seconds", 0.0) for v in layers.values()), 3)
        row["puts"] = sum(v.get("puts", 0) for v in layers.values())
        row["put_errors"] = {f"{name}:{kind}": n for name, v in layers.items() for kind, n in v.get("error_kinds", {}).items()}
        row["layers"] = {name: {k: v[k] for k in ("hits", "misses", "puts", "put_errors", "seconds")} for name, v in layers.items()}
    return row


def kcache_frames(profile: Path, limit: int = 25) -> list[dict[str, Any]]:
    """The kcache functions with the most cumulative time on the profiled (main) thread."""
    stats = pstats.Stats(str(profile))
    rows = []
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if "/kcache/" in filename or "/kcache_schemas/" in filename:
            rel = filename.split("/client/")[-1].split("/schemas/")[-1]
            rows.append({"function": f"{rel}:{line}({name})", "calls": calls, "tottime_s": round(tottime, 4), "cumtime_s": round(cumtime, 4)})
    rows.sort(key=lambda r: -r["cumtime_s"])
    return rows[:limit]


def _summary(rows: list[dict[str, Any]], scenario: str) -> dict[str, Any]:
    mine = [r for r in rows if r["scenario"] == scenario]
    if not mine:
        return {}
    out: dict[str, Any] = {"n": len(mine)}
    for field in ("compile_s", "process_s", "exit_s", "kcache_seconds", "uploader_cpu_s"):
        values = [r[field] for r in mine if r.get(field) is not None]
        if values:
            out[field] = {"median": round(common.median(values), 3), "min": min(values), "max": max(values)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each scenario (interleaved)")
    parser.add_argument("--graphs", type=int, default=3, help="FX graphs (C++ modules) of the torch.compile part")
    parser.add_argument("--kernels", type=int, default=40, help="Triton kernels compiled")
    parser.add_argument("--autotune", type=int, default=60, help="autotune lookups and saves")
    parser.add_argument("--base", action="append", default=[], metavar="NAME=DIR",
                        help="another checkout whose client runs as scenario populate-NAME (repeatable)")
    parser.add_argument("--profile", action="append", default=[], metavar="SCENARIO",
                        help="one more run of SCENARIO under cProfile (repeatable)")
    parser.add_argument("--tag", default="", help="suffix of the result file")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        job(args)
        return {}
    args.bases = {f"populate-{name}": path for name, _, path in (b.partition("=") for b in args.base)}
    scenarios = ["cold", "populate", *args.bases]
    root = common.tmp_root("populate-")
    result: dict[str, Any] = {"machine": common.machine(), "settings": {k: getattr(args, k) for k in ("runs", "graphs", "kernels", "autotune", "base")}}
    rows: list[dict[str, Any]] = []
    try:
        with common.kcache_service(root / "service") as url:
            for k in range(args.runs):
                order = scenarios[k % len(scenarios):] + scenarios[: k % len(scenarios)]
                for scenario in order:
                    row = run_one(root, scenario, k, url, args)
                    rows.append(row)
                    print(f"round {k} {scenario:16s} compile {row['compile_s']:7.2f} s  exit {row['exit_s']:5.2f} s  "
                          f"uploader cpu {row['uploader_cpu_s'] or 0:5.2f} s  "
                          f"kcache {row.get('kcache_seconds', 0):5.2f} s  load {row['loadavg_1m_at_start']:.1f}  "
                          f"put_errors {row.get('put_errors', {})}", flush=True)
            for scenario in args.profile:
                profile = root / f"{scenario}.pstats"
                profiled = run_one(root, scenario, args.runs, url, args, profile=profile)
                stats = pstats.Stats(str(profile))
                result.setdefault("profiles", {})[scenario] = {
                    "compile_s": profiled["compile_s"], "profile_total_s": round(stats.total_tt, 3),  # type: ignore[attr-defined]
                    "kcache_frames": kcache_frames(profile)}
    finally:
        common.drop_dir(root)
    result["runs"] = rows
    result["summary"] = {s: _summary(rows, s) for s in scenarios}
    cold = result["summary"]["cold"]["compile_s"]["median"]
    ratios = {f"{s}/cold": round(result["summary"][s]["compile_s"]["median"] / cold, 3) for s in scenarios if s != "cold"}
    result["ratios"] = ratios
    result["target"] = f"populate/cold <= {TARGET}"
    result["verdict"] = common.verdict(ratios["populate/cold"] <= TARGET)
    result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print("\nmedians (compile s):", {s: result["summary"][s]["compile_s"]["median"] for s in scenarios})
    print("ratios:", ratios, result["verdict"])
    for scenario, prof in result.get("profiles", {}).items():
        print(f"profile of {scenario} (main thread, {prof['profile_total_s']} s): kcache frames by cumulative time")
        for frame in prof["kcache_frames"][:15]:
            print(f"  {frame['cumtime_s']:7.3f} s cum  {frame['calls']:6d} calls  {frame['function']}")
    common.write_result("populate_overhead" + (f"_{args.tag}" if args.tag else ""), result)
    return result


if __name__ == "__main__":
    main()
