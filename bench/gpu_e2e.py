"""GPU end-to-end proof: fleet warm start with real models, each node a fresh process.

For each workload (``bench/gpu_workloads.py``), against a kcache service on the embedded default
on the same machine:

* ``cold``           kcache off, empty local caches: first ``torch.compile`` call time.
* ``populate``       kcache on, empty service (+ KCACHE_WORKLOAD, so the manifest is published).
* ``kcache-warm``    a fresh node with kcache on.
* ``kcache-prefetch`` a fresh node with KCACHE_WORKLOAD set: prefetch from interpreter start.
* ``kernels-only``   a fresh node with only the kernel layer (Triton cache manager; no FX layer).
* ``local-warm``     the cold node's own caches, second process (the limit).
* ``local-warm-kcache`` the same with kcache on (read-only): what a node with warm local caches
                     gets from kcache's client-side fixes (e.g. coordinate-descent reuse), so the
                     warm/local comparison is also made with both sides running kcache.
* ``copied-warm``    a fresh node, kcache off, whose Inductor and Triton cache dirs were copied
                     (``cp -r``) from the cold/local-warm node before it started: what users do
                     today, the honest baseline for a cache that ships the same files (issue 26).
                     It lacks what local-warm keeps besides those dirs: the page cache of the
                     originals, ``~/.nv/ComputeCache`` (the CUDA driver's JIT cache, per HOME).

With Dynamo's precompile cache on (``TORCH_CACHING_PRECOMPILE=1``, the user's opt-in; kcache's
``dynamo`` layer serves its packages, ``client/kcache/layers/dynamo/packages.py``), against a second
service of their own (so populate and populate-precompile both compile cold):

* ``populate-precompile``    kcache on, a fresh node, its own workload: compiles, and kcache saves
                             and uploads the packages at exit (no ``save_cache_artifacts`` call).
* ``kcache-warm-precompile`` a fresh node, kcache on: Dynamo's package from the service.
* ``local-warm-precompile``  the populate-precompile node's caches (torch's own ``dynamo`` dir
                             included, which kcache's save at exit wrote), second process, kcache
                             off: what a node that saved its packages gets without kcache.
* ``copied-warm-precompile`` a fresh node, kcache off, precompile on, with the populate-precompile
                             node's dirs copied in (its ``dynamo/`` packages included).

Rounds: round 0 runs every selected scenario once, in ``--scenarios`` order (each after its
prerequisite: ``local-warm``/``copied-warm`` after ``cold``, ``kcache-warm`` after ``populate``,
...); ``--repeats N`` adds N rounds of the repeated scenarios (``REPEATED``), round-robin
and rotated (A B C, B C A, C A B: no scenario always last), a fresh node each time for the fresh-node scenarios. The summary
gives per scenario the median (min-max, n) of all its runs, the ratios of medians issue 26 sets
targets for (``RATIOS``), and its health: failed runs (exit != 0 or killed), Traceback lines and
``kcache:`` lines in the nodes' stderr, and for Dynamo's packages the runs that fetched one and
any that did not pay (``NOT PAID``, with the node's reason: kcache then quarantines the package,
so the scenario's later fresh nodes run without one and its median mixes both; the table says so). It ends with a compact markdown table on stdout (also
``<out>/gpu_e2e<tag>.md``). ``--budget-s`` stops starting runs that would end after that many
seconds (estimates from the runs so far) and still prints the table of what ran.

Each run records the first-call time, its time to first result (process start to the first
output), where the time before the first call went (``startup``) and the process's exit after
it (``exit_s``), Inductor's cache counters and phase timers, kcache's stats, and saves its output
so every run can be compared with the cold one. Writes ``<out>/gpu_e2e<tag>.json``, the table and
a bar chart ``<out>/gpu_e2e<tag>.png``.

Nodes get explicit cache dirs by default (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``,
``KCACHE_LOCAL_DIR`` under the node). ``--default-env`` runs them as users do: none of those set,
each node its own ``HOME`` and ``TMPDIR`` instead (Inductor's ``/tmp/torchinductor_$USER`` under
the node's ``TMPDIR``, Triton's ``~/.triton/cache`` and kcache's ``~/.cache/kcache/client`` under
its ``HOME``), and ``kcache-warm`` also sets ``KCACHE_WORKLOAD`` (a fresh node whose workload is
published: prefetch starts at interpreter start, racing ``import torch``).

    python bench/gpu_e2e.py --out bench/results [--workloads resnet50,gpt2-train,...] [--default-env]
    python bench/gpu_e2e.py --out /tmp/smoke --workloads tiny --device cpu --default-env \
        --scenarios cold,populate,local-warm,copied-warm,kcache-warm --repeats 2   # orchestration check
    bash bench/results/gpu/run_issue26.sh TAG WORKLOADS [BUDGET_S]   # one device call (issue 26)
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCENARIOS = [
    "cold", "populate", "kcache-warm", "kcache-prefetch", "kernels-only", "local-warm", "local-warm-kcache", "copied-warm",
    "populate-precompile", "kcache-warm-precompile", "local-warm-precompile", "local-warm-precompile-kcache",
    "kcache-warm-precompile-again", "copied-warm-precompile",
]
REPEATED = (
    "kcache-warm", "kcache-prefetch", "local-warm", "local-warm-kcache", "copied-warm", "kcache-warm-precompile",
    "local-warm-precompile", "local-warm-precompile-kcache", "kcache-warm-precompile-again", "copied-warm-precompile",
)  # what --repeats runs again (with --repeat-cold also cold and populate)
WORKLOADS = ["resnet50", "gpt2-train", "gpt2-autotune", "triton-op"]  # the default set; bench/gpu_workloads.py has all


# ---------------------------------------------------------------------------------------------
# Workloads (child side)
# ---------------------------------------------------------------------------------------------


def child(workload: str, device: str, out: Path, sizes: str = "") -> None:
    t_start = time.perf_counter()
    import torch

    t_torch = time.perf_counter()
    # With Dynamo's precompile cache on, torch loads the package (and its compiled graphs) when
    # torch.compile wraps the model, not at the first call: time the wrapping too, and count it
    # as part of the first call, so every scenario's first_call_s is compile + first step.
    # torch.compile imports Dynamo and Inductor on its first use (3-4 s on the H100 machine):
    # import them first, so the wrapping time is the package's work alone and first_call_s
    # stays comparable with the runs before this change (they did not time the wrapping).
    import torch._dynamo
    import torch._inductor.compile_fx
    from torch._dynamo.utils import counters

    from bench.gpu_workloads import build, parse_sizes

    t_inductor = time.perf_counter()
    wrap_s = [0.0]
    original_compile = torch.compile
    profiler = None
    if os.environ.get("KCACHE_BENCH_PROFILE"):
        import cProfile

        profiler = cProfile.Profile()

    def timed_compile(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        if profiler is not None:  # the wrapping is where a precompile package loads
            profiler.enable()
        try:
            return original_compile(*args, **kwargs)
        finally:
            if profiler is not None:
                profiler.disable()
            wrap_s[0] += time.perf_counter() - t

    torch.compile = timed_compile  # type: ignore[assignment]
    step, inputs, info = build(workload, device, parse_sizes(sizes))
    torch.compile = original_compile
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t_built = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    from bench.first_call_probe import FirstCallProbe

    probe = FirstCallProbe()  # the call only (not the wrapping): where its main thread's time went
    probe.start()
    t0_wall = time.time()
    t0 = time.perf_counter()
    result = step(inputs)
    sync()
    call_s = time.perf_counter() - t0
    call_cpu = probe.stop()
    first_call_s = wrap_s[0] + call_s
    first_result_at = time.time()  # wall clock: the orchestrator knows when it started the process
    if profiler is not None:
        profiler.disable()
        _write_profile(profiler, out)
    torch.save(result.detach().float().cpu(), out / "output.pt")
    stats = None
    t_close = time.perf_counter()
    try:
        from kcache.current import get_runtime

        rt = get_runtime()
        if rt is not None:
            prefetch = None
            if rt.prefetcher is not None:
                prefetch = {"seconds": rt.prefetcher.seconds, "counts": rt.prefetcher.counts}
            rt.close()  # flush uploads, publish the workload (what atexit would do)
            stats = {"layers": {n: c.model_dump() for n, c in rt.stats.snapshot().items()}, "prefetch": prefetch, "bundle_emit_s": rt.bundle_emit_s,
                     # post-install findings: "unprofitable" is a Dynamo package that did not pay here
                     # (kcache.layers.dynamo.payoff), quarantined for the nodes after this one
                     "verification": rt.stats.document().verification}
            try:  # kernels the prefetch wrote into Inductor's dir before the first call asked
                from kcache.layers.inductor.kernel_preemit import PreEmit

                pre = rt.layer_state(PreEmit)
                stats["pre_emit"] = {"emitted": pre.emitted, "seconds": pre.seconds, "dir": str(pre.cache_dir)}
            except ImportError:  # a kcache before the pre-emit
                pass
    except ImportError:
        pass
    from torch._dynamo.utils import compilation_time_metrics

    report = {
        "workload_info": info,
        # Where the time before the first call went (interpreter start itself is not in here:
        # the orchestrator's time_to_first_result_s has it).
        "startup": {
            "import_torch_s": round(t_torch - t_start, 3),
            "import_dynamo_inductor_s": round(t_inductor - t_torch, 3),
            "build_s": round(t_built - t_inductor - wrap_s[0], 3),  # model + inputs, wrapping excluded
        },
        "cache_dirs": _cache_dirs(),
        "first_call_s": first_call_s,  # torch.compile's wrapping + the first call
        "compile_wrap_s": wrap_s[0],
        "call_only_s": call_s,
        "call_cpu": call_cpu,  # bench/first_call_probe.py
        "first_call_started": t0_wall,  # wall clock, to line up with the compile trace
        "first_result_at": first_result_at,
        "pid": os.getpid(),
        "process_s": time.perf_counter() - t_start,
        "exit_flush_s": time.perf_counter() - t_close,
        "inductor": {k: v for k, v in counters["inductor"].items() if "cache" in k or "bundler" in k},
        "aot_autograd": dict(counters["aot_autograd"]),
        "counters": {category: dict(values) for category, values in counters.items()},
        # Inductor's own phase timers (dynamo_timed): total seconds and calls per phase.
        "phases": {k: [round(sum(v), 4), len(v)] for k, v in compilation_time_metrics.items()},
        "kcache": stats,
    }
    report["report_written_at"] = time.time()  # the orchestrator times the process's exit from here
    (out / "report.json").write_text(json.dumps(report, indent=1))


def _cache_dirs() -> dict[str, Any]:
    """Where this node's caches ended up (torch and Triton asked after the run), with the number
    of entries in each: in --default-env mode, proof that nothing was pointed anywhere."""
    dirs: dict[str, Any] = {
        "tempdir": tempfile.gettempdir(),
        "home": os.path.expanduser("~"),
        "TRITON_CACHE_DIR_at_exit": os.environ.get("TRITON_CACHE_DIR"),  # Inductor sets it when unset
        "TRITON_CACHE_MANAGER": os.environ.get("TRITON_CACHE_MANAGER"),
    }
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir

        dirs["inductor"] = cache_dir()
        dirs["inductor_triton"] = triton_cache_dir(0)
    except Exception as e:  # another torch layout: say so, do not fail the run
        dirs["inductor"] = f"? {e!r}"
    try:
        import triton

        dirs["triton_knobs"] = triton.knobs.cache.dir
    except Exception as e:
        dirs["triton_knobs"] = f"? {e!r}"
    try:
        from kcache.config import ClientConfig

        dirs["kcache_local"] = str(ClientConfig.from_env().local_root())
    except Exception as e:
        dirs["kcache_local"] = f"? {e!r}"
    counts: dict[str, int] = {}
    for name in ("inductor_triton", "triton_knobs"):
        path = Path(str(dirs.get(name, "?")))
        counts[name] = sum(1 for _ in path.iterdir()) if path.is_dir() else 0
    local = Path(str(dirs.get("kcache_local", "?")))
    counts["kcache_local_files"] = sum(1 for f in local.rglob("*") if f.is_file()) if local.is_dir() else 0
    dirs["entries"] = counts
    return dirs


def _write_profile(profiler: Any, out: Path) -> None:
    import io
    import pstats

    profiler.dump_stats(out / "profile.pstats")
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("cumulative").print_stats(70)
    stats.sort_stats("tottime").print_stats(40)
    (out / "profile.txt").write_text(text.getvalue())


# ---------------------------------------------------------------------------------------------
# Orchestrator
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    def __init__(self, data_dir: Path) -> None:
        import urllib.request

        data_dir.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):  # a port another bench process took meanwhile: our server exits, try another
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kcache.cli", "serve", "--port", str(self.port), "--data-dir", str(data_dir), "--log-level", "warning"],
                stdout=subprocess.DEVNULL, stderr=open(data_dir.parent / f"service-{self.port}.log", "w"),  # noqa: SIM115
                env={**os.environ, "KCACHE_AUTOLOAD": "0"},
            )
            for _ in range(300):
                if self.proc.poll() is not None:
                    break
                try:
                    urllib.request.urlopen(f"{self.url}/healthz", timeout=1)
                except OSError:
                    time.sleep(0.1)
                    continue
                time.sleep(0.2)  # answered: ours, unless it exits now (the port was someone else's)
                if self.proc.poll() is None:
                    return
                break
        raise RuntimeError("kcache service did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


_T0 = time.monotonic()


def log(msg: str) -> None:
    """A progress line with the wall clock and the seconds since the bench started."""
    print(f"{time.strftime('%H:%M:%S')} +{time.monotonic() - _T0:4.0f}s {msg}", flush=True)


def run_node(
    workload: str,
    scenario: str,
    node: Path,
    device: str,
    env_extra: dict[str, str],
    timeout: float,
    default_env: bool = False,
    sizes: str = "",
) -> dict[str, Any]:
    out = node / f"out-{scenario}"
    out.mkdir(parents=True, exist_ok=True)
    drop = ("KCACHE_", "TRITON_CACHE", "TORCHINDUCTOR_CACHE", "TRITON_HOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    trace = out / "trace"
    shutil.rmtree(trace, ignore_errors=True)
    trace.mkdir()
    here = Path(__file__).resolve().parent
    if default_env:
        # The user's default environment: no cache dir named anywhere. The node's own HOME and
        # TMPDIR keep nodes apart (Inductor: $TMPDIR/torchinductor_$USER; Triton: ~/.triton/cache;
        # kcache: ~/.cache/kcache/client). The user's identity stays (getpass reads USER/LOGNAME).
        home, tmp = node / "home", node / "tmp"
        home.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)  # tempfile ignores a TMPDIR that does not exist
        # XDG_CACHE_HOME would move kcache's local tier out of the node; a HOME-based user site
        # (pip install --user) stays visible; the models are built from code (pretrained=False,
        # from_config), so the fresh HOME's empty torch hub / HF caches need no network: the
        # offline switches make sure nothing tries.
        env.pop("XDG_CACHE_HOME", None)
        import site

        env.setdefault("PYTHONUSERBASE", site.getuserbase())
        env.update(HOME=str(home), TMPDIR=str(tmp), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    else:
        env.update(
            TORCHINDUCTOR_CACHE_DIR=str(node / "inductor"),
            TRITON_CACHE_DIR=str(node / "triton"),
            KCACHE_LOCAL_DIR=str(node / "kcache-local"),
        )
    env.update(
        # gpu_trace/sitecustomize.py logs every triton.compile of the node's processes to `trace`.
        PYTHONPATH=os.pathsep.join([str(here.parent), str(here / "gpu_trace"), env.get("PYTHONPATH", "")]),
        KCACHE_BENCH_TRACE_DIR=str(trace),
        **env_extra,
    )
    shown = ("KCACHE_", "TRITON_", "TORCHINDUCTOR_", "TORCH_CACHING", "HOME", "TMPDIR", "HF_", "TRANSFORMERS_OFFLINE", "PYTHONUSERBASE", "XDG_")
    node_env = {k: v for k, v in sorted(env.items()) if k.startswith(shown) and k != "KCACHE_BENCH_TRACE_DIR"}
    cmd = [sys.executable, __file__, "--child", workload, "--device", device, "--child-out", str(out)]
    if sizes:
        cmd += ["--sizes", sizes]
    started_at = time.time()
    t0 = time.perf_counter()
    # Its own session, so a node cut off by its timeout goes with its compile workers.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        stdout, stderr = proc.communicate()
    except BaseException:  # SIGTERM/Ctrl-C of the bench: the node goes too
        _kill(proc)
        proc.wait()
        raise
    ended_at = time.time()
    wall = time.perf_counter() - t0
    (out / "stderr.txt").write_text(stderr[-200_000:])
    if stdout.strip():
        (out / "stdout.txt").write_text(stdout[-50_000:])
    summary = stderr_summary(stderr)
    if timed_out or proc.returncode != 0:
        why = f"timeout after {timeout:.0f} s (killed)" if timed_out else f"exit {proc.returncode}"
        return {"error": f"{why}: {stderr[-1500:]}", "rc": proc.returncode, "timed_out": timed_out, "wall_s": wall, "node_env": node_env, "stderr": summary}
    report = json.loads((out / "report.json").read_text())
    report["wall_s"] = wall
    report["rc"] = 0
    # Process start to first output: what a user waits for (imports, model, first call).
    report["time_to_first_result_s"] = report["first_result_at"] - started_at
    report["interpreter_start_s"] = report["time_to_first_result_s"] - (report["process_s"] - report["exit_flush_s"]) if "process_s" in report else None
    report["exit_s"] = ended_at - report.get("report_written_at", ended_at)  # atexit work, compile workers' shutdown
    report["node_env"] = node_env
    report["stderr"] = summary
    report["triton_compiles"] = summarize_trace(trace, report)
    return report


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the node's session: it and its compile workers
    except (ProcessLookupError, PermissionError):
        proc.kill()


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit))(: .*)?$")


def stderr_summary(text: str) -> dict[str, Any]:
    """What a node said on stderr that a user would notice: tracebacks, the exceptions they
    ended in, and kcache's own lines. ``tracebacks`` counts lines containing "Traceback" (what
    ``grep -c Traceback`` gave in earlier results)."""
    lines = text.splitlines()
    kcache_lines = [line for line in lines if "kcache:" in line]
    exceptions = list(dict.fromkeys(line.strip()[:240] for line in lines if _EXCEPTION_LINE.match(line.strip())))
    return {
        "tracebacks": sum("Traceback" in line for line in lines),
        "exceptions": exceptions[:6],
        "kcache_lines": len(kcache_lines),
        "kcache_first": list(dict.fromkeys(line[:240] for line in kcache_lines))[:8],
        "warnings": sum("Warning" in line for line in lines),
        "lines": len(lines),
    }


def summarize_trace(trace: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Triton compiles of the node: cache hits and real compiles, in the main process and in
    Inductor's compile workers, and those that fell inside the first call."""
    events = [json.loads(line) for f in trace.glob("compiles-*.jsonl") for line in f.read_text().splitlines()]
    start, end = report["first_call_started"], report["first_call_started"] + report["first_call_s"]
    summary: dict[str, Any] = {}
    for where in ("main", "workers"):
        mine = [e for e in events if (e["pid"] == report["pid"]) == (where == "main")]
        misses = [e for e in mine if not e["hit"]]
        summary[where] = {
            "hits": len(mine) - len(misses),
            "compiled": len(misses),
            "compiled_in_first_call": sum(start <= e["t"] <= end for e in misses),
            "compile_s": round(sum(e["lower_us"] for e in misses) / 1e6, 3),
            "processes": len({e["pid"] for e in mine}),
            "compiled_names": sorted({e["name"] for e in misses})[:30],
        }
    return summary


def compare_outputs(reference: Path, other: Path) -> dict[str, Any]:
    import torch

    a, b = torch.load(reference), torch.load(other)
    return {"bitwise_equal": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max()) if a.shape == b.shape else None}


def node_cache_dirs(node: Path, default_env: bool) -> list[Path]:
    """A node's Inductor and Triton cache dirs: in the default environment
    ``$TMPDIR/torchinductor_$USER`` (Triton's kernels of Inductor under its ``triton/``, torch's
    ``dynamo/`` packages, FX graphs, AOTAutograd entries, ...) and ``$HOME/.triton/cache``."""
    if default_env:
        inductor = sorted(p for p in (node / "tmp").glob("torchinductor_*") if p.is_dir())
        return inductor + [d for d in [node / "home" / ".triton" / "cache"] if d.is_dir()]
    return [d for d in (node / "inductor", node / "triton") if d.is_dir()]


def copy_caches(src: Path, dst: Path, default_env: bool) -> dict[str, Any]:
    """What users do today to start a node warm: ``cp -r`` of a warm node's cache dirs into a
    fresh node before it starts (``shutil.copytree`` with ``shutil.copy``: contents and modes, new
    mtimes, links as links). Triton's group files (``__grp__*.json``) hold their children's
    absolute paths; on a fleet the copy lands at the same path (same ``$HOME``/``$TMPDIR``), so
    the source node's prefix in them is rewritten to this node's (without it, Triton would read
    the kernel files from the source node's dir, which exists on this machine only)."""
    t = time.perf_counter()
    copied, files, size, rewritten, other_json = [], 0, 0, 0, 0
    old, new = f"{src}{os.sep}", f"{dst}{os.sep}"
    for d in node_cache_dirs(src, default_env):
        target = dst / d.relative_to(src)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(d, target, symlinks=True, copy_function=shutil.copy)
        copied.append(str(d.relative_to(src)))
        for f in target.rglob("*"):
            if not f.is_file() or f.is_symlink():
                continue
            files += 1
            size += f.stat().st_size
            if f.suffix == ".json":
                text = f.read_text(errors="replace")
                if old in text:
                    if f.name.startswith("__grp__"):
                        f.write_text(text.replace(old, new))
                        rewritten += 1
                    else:
                        other_json += 1
    return {
        "from": src.name, "dirs": copied, "files": files, "mb": round(size / 1e6, 1), "seconds": round(time.perf_counter() - t, 2),
        "grp_paths_rewritten": rewritten, "other_json_naming_source": other_json,
    }


# ---------------------------------------------------------------------------------------------
# Scenarios, rounds, the time budget
# ---------------------------------------------------------------------------------------------

# What a scenario needs to have run before it (in the same workload), when both are selected.
PREREQ = {
    "local-warm": "cold", "local-warm-kcache": "cold", "copied-warm": "cold",
    "kcache-warm": "populate", "kcache-prefetch": "populate", "kernels-only": "populate",
    "kcache-warm-precompile": "populate-precompile", "local-warm-precompile": "populate-precompile",
    "local-warm-precompile-kcache": "populate-precompile", "copied-warm-precompile": "populate-precompile",
    "kcache-warm-precompile-again": "kcache-warm-precompile",
}
HEAVY = ("cold", "populate", "populate-precompile", "kernels-only")  # they compile
# "--workloads bert@pc": the workload with these scenarios instead of --scenarios (a second row
# in the table; with GPUS=N in run_issue26.sh, on a GPU of its own).
VARIANTS = {
    "pc": ["cold", "local-warm", "populate-precompile", "kcache-warm-precompile", "copied-warm-precompile"],
}


@dataclass
class Plan:
    scenario: str
    node: str  # the node dir (a repeat of a fresh-node scenario gets "<node>-r<i>")
    env: dict[str, str]
    service: str | None = None  # "main" or "pc" (KCACHE_URL set at run time)
    copy_from: str | None = None  # copied-warm: the node whose cache dirs are copied in first


def plans_for(workload: str, default_env: bool) -> dict[str, Plan]:
    on = {"KCACHE_FLUSH_TIMEOUT_S": "60"}
    off = {"KCACHE_MODE": "off", "KCACHE_TRITON_MANAGER": "0"}
    # In the default environment the fresh node runs as a fleet job does: with its workload named
    # (prefetch from interpreter start, while the main thread is still importing torch).
    warm = {**on, "KCACHE_WORKLOAD": workload} if default_env else on
    # Dynamo's precompile cache on, with a workload of its own (its manifest lists the packages).
    pc = {"TORCH_CACHING_PRECOMPILE": "1"}
    pc_workload = {"KCACHE_WORKLOAD": f"{workload}-precompile"}
    warm_pc = {**on, **pc, **pc_workload} if default_env else {**on, **pc}
    plans = [
        Plan("cold", "node-cold", off),
        Plan("populate", "node-populate", {**on, "KCACHE_WORKLOAD": workload}, "main"),
        Plan("kcache-warm", "node-warm", warm, "main"),
        Plan("kcache-prefetch", "node-prefetch", {**on, "KCACHE_WORKLOAD": workload, "KCACHE_MODE": "readonly"}, "main"),
        Plan("kernels-only", "node-kernels", {**on, "KCACHE_LAYERS": "none"}, "main"),
        Plan("local-warm", "node-cold", off),  # the cold node again, caches kept
        Plan("local-warm-kcache", "node-cold", {**on, "KCACHE_MODE": "readonly"}, "main"),
        Plan("copied-warm", "node-copied", off, copy_from="node-cold"),
        # The precompile scenarios have a service of their own: populate-precompile must compile
        # cold (a graph that was an FX/AOTAutograd cache hit cannot be packaged), and populate
        # must not find populate-precompile's uploads (populate / cold would not be a cold compile).
        Plan("populate-precompile", "node-populate-pc", {**on, **pc, **pc_workload}, "pc"),
        Plan("kcache-warm-precompile", "node-warm-pc", warm_pc, "pc"),
        Plan("local-warm-precompile", "node-populate-pc", {**off, **pc}),  # that node's caches, kcache off
        # Which part of a fresh node's extra time is kcache in the process, which the node being new:
        # the populating node's own package with kcache on, and the fresh node a second time.
        Plan("local-warm-precompile-kcache", "node-populate-pc", {**on, **pc, "KCACHE_MODE": "readonly"}, "pc"),
        Plan("kcache-warm-precompile-again", "node-warm-pc", warm_pc, "pc"),
        Plan("copied-warm-precompile", "node-copied-pc", {**off, **pc}, copy_from="node-populate-pc"),
    ]
    return {p.scenario: p for p in plans}


def scenario_order(selected: list[str]) -> list[str]:
    """The selected scenarios in the order given, each after its prerequisite when that is
    selected too (``local-warm`` after ``cold``, ``kcache-warm`` after ``populate``, ...)."""
    order: list[str] = []

    def add(s: str) -> None:
        if s in order:
            return
        if (pre := PREREQ.get(s)) and pre in selected:
            add(pre)
        order.append(s)

    for s in selected:
        add(s)
    return order


class Budget:
    """Seconds left before ``--budget-s`` (counted from the bench's start), minus a reserve for
    the summary; a run is skipped when its estimate does not fit."""

    def __init__(self, seconds: float | None, reserve_s: float = 15.0) -> None:
        self.deadline = _T0 + seconds if seconds else None
        self.reserve_s = reserve_s

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic() - self.reserve_s


class WorkloadBench:
    """One workload's nodes and services; ``run_round(k)`` runs round k (round 0: every selected
    scenario once, in order; round k ≥ 1: the repeated scenarios again, round-robin)."""

    def __init__(self, workload: str, args: argparse.Namespace, budget: Budget, save: Any, selected: list[str]) -> None:
        self.workload, self.args, self.budget, self.save = workload, args, budget, save
        # "name@variant": the workload with the variant's scenarios (VARIANTS), e.g. bert@pc.
        self.base, _, variant = workload.partition("@")
        ident = workload.replace("@", "-")  # node dirs and KCACHE_WORKLOAD names
        self.root = Path(args.work_dir) / ident
        self.plans = plans_for(ident, args.default_env)
        self.spec = workload_specs().get(self.base)
        if variant:
            selected = VARIANTS[variant]
        self.runs: dict[str, Any] = {}
        self.result: dict[str, Any] = {"summary": {}, "runs": self.runs, "skipped": [], "order": []}
        self.services: dict[str, Service] = {}
        self.walls: dict[str, list[float]] = {}
        packable = self.spec is None or self.spec.precompile_ok or args.force_precompile
        chosen = bool(variant) or not args.precompile_workloads or workload in args.precompile_workloads.split(",")
        self.order = [s for s in scenario_order(selected) if (packable and chosen) or "precompile" not in s]
        for s in scenario_order(selected):
            if s not in self.order:
                why = "not in --precompile-workloads" if not chosen else "torch 2.11 cannot package this workload (README); --force-precompile runs it"
                self.skip(s, 0, why)
        repeated = set(REPEATED) | ({"cold", "populate"} if args.repeat_cold else set())
        self.repeated = [s for s in self.order if s in repeated]
        self.ref = self.root / "node-cold" / "out-cold" / "output.pt"  # every other output is compared with it
        self.started = False

    def start(self) -> None:
        if not self.started:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root.mkdir(parents=True)
            self.started = True

    def service_url(self, name: str) -> str:
        if name not in self.services:
            (self.root / f"service-{name}").mkdir(parents=True, exist_ok=True)
            self.services[name] = Service(self.root / f"service-{name}" / "data")
        return self.services[name].url

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()
        self.services.clear()

    def skip(self, scenario: str, k: int, why: str) -> None:
        self.result["skipped"].append({"scenario": scenario, "round": k, "why": why})
        if k == 0:
            self.runs[scenario] = {"skipped": why}
        log(f"[{self.workload}] {scenario} round {k}: skipped ({why})")

    def ok(self, scenario: str) -> bool:
        run = self.runs.get(scenario)
        return bool(run) and "error" not in run and "skipped" not in run

    def estimate(self, scenario: str) -> float:
        """Seconds this run will take: the slowest run of the scenario so far, else of its kind
        (compiling / warm) in this workload, else the workload's estimate for an H100."""
        if mine := self.walls.get(scenario):
            return max(mine)
        heavy = scenario in HEAVY
        seen = [w for s, ws in self.walls.items() if (s in HEAVY) == heavy for w in ws]
        if seen:
            return max(seen)
        cold = self.spec.est_cold_wall_s if self.spec else 60.0
        return cold if heavy else min(cold, 40.0)

    def run_round(self, k: int) -> None:
        self.start()
        # Round k starts k scenarios later than round 0's order of them (A B C, B C A, C A B): a
        # scenario always last in its round would always run beside the same neighbour (on a
        # shared host, another workload's cold compile), which biased the medians of h3a. (Round 1
        # once repeated round 0's order, so kcache-warm ran last in two of three rounds: h4a.)
        shift = k % len(self.repeated) if self.repeated else 0
        repeated = self.repeated[shift:] + self.repeated[:shift]
        for scenario in self.order if k == 0 else repeated:
            self.run_one(scenario, k)

    def run_one(self, scenario: str, k: int, profile: bool = False) -> dict[str, Any] | None:
        plan = self.plans[scenario]
        label = f"{scenario}-profiled" if profile else scenario if k == 0 else f"{scenario}-r{k - 1}"
        # A fresh-node scenario gets a fresh node each round; the local scenarios rerun theirs.
        reuse = k == 0 or scenario.startswith("local-warm") or scenario.endswith("-again")
        node = plan.node if reuse else f"{plan.node}-profiled" if profile else f"{plan.node}-r{k - 1}"
        if (pre := PREREQ.get(scenario)) and pre in self.order and not self.ok(pre):
            self.skip(scenario, k, f"prerequisite {pre} did not run or failed")
            return None
        est, left = self.estimate(scenario), self.budget.left()
        if left < est * 1.1:
            self.skip(scenario, k, f"budget: {max(left, 0):.0f} s left, {est * 1.1:.0f} s needed (1.1 x its slowest run so far, or the estimate)")
            return None
        env = dict(plan.env)
        extra_service = None
        if plan.service:
            if k > 0 and scenario == "populate":  # a repeat of populate needs an empty service
                extra_service = Service(self.root / f"service-populate-r{k - 1}" / "data")
                env["KCACHE_URL"] = extra_service.url
            else:
                env["KCACHE_URL"] = self.service_url(plan.service)
        if profile:
            env["KCACHE_BENCH_PROFILE"] = "1"
        copied = copy_caches(self.root / plan.copy_from, self.root / node, self.args.default_env) if plan.copy_from else None
        log(f"[{self.workload}] {label} ..." + (f" (copied {copied['mb']} MB, {copied['files']} files in {copied['seconds']} s)" if copied else ""))
        try:
            rep = run_node(self.base, label, self.root / node, self.args.device, env, min(self.args.timeout, left), self.args.default_env, self.args.sizes)
        finally:
            if extra_service is not None:
                extra_service.stop()
        if copied:
            rep["copied"] = copied
        rep["round"] = k
        self.walls.setdefault(scenario, []).append(rep["wall_s"])
        out = self.root / node / f"out-{label}" / "output.pt"
        if (scenario != "cold" or k > 0) and "error" not in rep and self.ref.exists() and out.exists():
            rep["output_vs_cold"] = compare_outputs(self.ref, out)  # now: a later cut-off keeps it
        if profile:
            self.runs[label] = rep
        elif k == 0:
            self.runs[scenario] = rep
        else:
            self.runs.setdefault(f"{scenario}-repeats", []).append(rep.get("first_call_s"))
            self.runs.setdefault(f"{scenario}-repeat-reports", []).append(rep)
        self.result["order"].append(label)
        log(f"[{self.workload}] {label}: {_one_line(rep)}")
        self.result["summary"] = summarize(self.runs)
        self.save(self.result)
        return rep

    def run_profiled(self, scenarios: list[str], profile_out: Path) -> None:
        """cProfile reruns (cProfile slows the process: their times are not used anywhere)."""
        for scenario in scenarios:
            if scenario not in self.plans or scenario == "cold":
                continue
            rep = self.run_one(scenario, 1, profile=True)
            node = self.plans[scenario].node
            prof_node = node if scenario.startswith("local-warm") or scenario.endswith("-again") else f"{node}-profiled"
            text = self.root / prof_node / f"out-{scenario}-profiled" / "profile.txt"
            if rep is not None and text.exists():
                profile_out.mkdir(parents=True, exist_ok=True)
                shutil.copy(text, profile_out / f"{self.workload}-{scenario}.txt")
                shutil.copy(text.with_name("profile.pstats"), profile_out / f"{self.workload}-{scenario}.pstats")


def _one_line(rep: dict[str, Any]) -> str:
    err = rep.get("stderr", {})
    health = f"tb={err.get('tracebacks', '?')} kcache:={err.get('kcache_lines', '?')}"
    if ((rep.get("kcache") or {}).get("verification") or {}).get("unprofitable"):
        health += " dynamo-package=NOT-PAID"  # kcache quarantined it: the scenario's next nodes go without
    if "error" in rep:
        first = rep["error"].splitlines()[0][:160]
        exc = (err.get("exceptions") or ["?"])[-1][:200]
        return f"FAILED {first} | {exc} | wall {rep['wall_s']:.0f} s {health}"
    same = rep.get("output_vs_cold", {})
    diff = "" if not same else " out=" + ("same" if same.get("bitwise_equal") else f"{same.get('max_abs_diff')}")
    return (
        f"first call {rep['first_call_s']:.2f} s (to first result {rep['time_to_first_result_s']:.1f} s, "
        f"exit {rep.get('exit_s', 0):.1f} s, wall {rep['wall_s']:.0f} s) {health}{diff}"
    )


# ---------------------------------------------------------------------------------------------
# Summary: medians, ratios, health, the markdown table
# ---------------------------------------------------------------------------------------------

# (numerator, denominator, target): the ratios of medians issue 26 asks for, then the controls.
RATIOS: list[tuple[str, str, float | None]] = [
    ("kcache-warm", "copied-warm", 1.0),
    ("kcache-warm", "local-warm", 1.05),
    ("populate", "cold", 1.05),
    ("kcache-warm-precompile", "local-warm", 0.6),
    ("kcache-warm-precompile", "copied-warm-precompile", 1.0),
    ("populate-precompile", "cold", 1.05),
    ("copied-warm", "local-warm", None),
    ("copied-warm-precompile", "local-warm", None),
    ("local-warm-precompile", "local-warm", None),
    ("kcache-warm", "local-warm-kcache", None),
    ("kcache-prefetch", "local-warm", None),
]


def _reports(runs: dict[str, Any], s: str) -> list[dict[str, Any]]:
    first = runs.get(s)
    reports = [first] if isinstance(first, dict) and "skipped" not in first else []
    return reports + list(runs.get(f"{s}-repeat-reports", []))


def summarize(runs: dict[str, Any]) -> dict[str, Any]:
    """First-call seconds per scenario (the median of all its runs, first run + repeats), with
    n/min/max, the ratios of medians (``RATIOS``), time to first result, and each scenario's
    health: runs, failed runs (non-zero exit or killed), Traceback lines, ``kcache:`` lines."""
    import statistics

    summary: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    health: dict[str, Any] = {}
    ttfr: dict[str, float] = {}
    for s in SCENARIOS:
        reports = _reports(runs, s)
        first = runs.get(s, {}) if isinstance(runs.get(s), dict) else {}
        values = [v for v in [first.get("first_call_s"), *runs.get(f"{s}-repeats", [])] if v]
        if reports:
            errs = [r.get("stderr") or {} for r in reports]
            health[s] = {
                "runs": len(reports),
                "failed": sum("error" in r for r in reports),
                "timeouts": sum(bool(r.get("timed_out")) for r in reports),
                "tracebacks": sum(e.get("tracebacks", 0) for e in errs),
                "runs_with_traceback": sum(bool(e.get("tracebacks")) for e in errs),
                "kcache_lines": sum(e.get("kcache_lines", 0) for e in errs),
                "exceptions": list(dict.fromkeys(x for e in errs for x in e.get("exceptions", [])))[:4],
                "errors": list(dict.fromkeys(r["error"].split(":")[0] for r in reports if "error" in r))[:3],
                "kcache_first": list(dict.fromkeys(x for e in errs for x in e.get("kcache_first", [])))[:4],
                # Dynamo's precompile package (kcache's dynamo layer): runs that fetched one, and
                # why one did not pay (after that verdict the service serves it to no node, so the
                # scenario's later fresh nodes run without a package: their times are not its).
                "package_runs": sum(bool(((r.get("kcache") or {}).get("layers") or {}).get("dynamo", {}).get("hits")) for r in reports),
                "did_not_pay": list(dict.fromkeys(reason for r in reports
                                                  for reason in ((r.get("kcache") or {}).get("verification") or {}).get("unprofitable", {})))[:3],
            }
        if not values:
            continue
        median = statistics.median(values)
        summary[s] = median
        stats[s] = {"n": len(values), "median": round(median, 3), "min": round(min(values), 3), "max": round(max(values), 3)}
        if len(values) > 1:
            summary[f"{s}-runs"] = values
            summary[f"{s}-median"] = median
        t = [r["time_to_first_result_s"] for r in reports if r.get("time_to_first_result_s")]
        if t:
            ttfr[s] = round(statistics.median(t), 2)
    for a, b, _ in RATIOS:
        if summary.get(a) and summary.get(b):
            summary[f"{a}/{b}"] = summary[a] / summary[b]
    if ttfr:
        summary["time_to_first_result"] = ttfr
    summary["stats"] = stats
    summary["health"] = health
    return summary


def _short(s: str) -> str:
    return s.replace("precompile", "pc").replace("kcache-", "kc-")


def markdown_table(results: dict[str, Any]) -> str:
    """Compact markdown: first-call medians, ratios against the targets, health per scenario
    (short enough to read from the last 12,000 characters of a command's output)."""
    workloads = results["workloads"]
    ran = [s for s in SCENARIOS if any(s in w["summary"].get("stats", {}) or s in w["summary"].get("health", {}) for w in workloads.values())]
    env = results.get("environment", {})
    if not ran:
        return "No run finished.\n"
    lines = [
        f"## kcache GPU e2e - {env.get('gpu', env.get('device', '?'))}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
        f"{env.get('environment', '?')} env, {env.get('date', '')}",
        "",
        "First call (torch.compile wrapping + first step), s: median (min-max) xn",
        "",
        "| workload | " + " | ".join(_short(s) for s in ran) + " |",
        "|---|" + "---|" * len(ran),
    ]
    for name, w in workloads.items():
        stats = w["summary"].get("stats", {})
        cells = []
        for s in ran:
            st = stats.get(s)
            if not st:
                cells.append("-" if s not in w["summary"].get("health", {}) else "failed")
            elif st["n"] == 1:
                cells.append(f"{st['median']:.2f}")
            else:
                cells.append(f"{st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f}) x{st['n']}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ratios = [(a, b, t) for a, b, t in RATIOS if any(f"{a}/{b}" in w["summary"] for w in workloads.values())]
    if ratios:
        lines += [
            "",
            "Ratios of medians (target; ok = met)",
            "",
            "| workload | " + " | ".join(f"{_short(a)} / {_short(b)}" + (f" (<= {t})" if t else "") for a, b, t in ratios) + " |",
            "|---|" + "---|" * len(ratios),
        ]
        for name, w in workloads.items():
            cells = []
            for a, b, t in ratios:
                v = w["summary"].get(f"{a}/{b}")
                cells.append("-" if v is None else f"{v:.2f}" + ("" if t is None else " ok" if v <= t else " **NO**"))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Health per scenario: runs / failed (exit != 0 or killed) / Traceback lines / `kcache:` lines; time to first result (median s); "
        "`pkg n`: runs that fetched a Dynamo package, `NOT PAID`: one did not pay and was quarantined (later runs go without it)",
        "",
        "| workload | " + " | ".join(_short(s) for s in ran) + " |",
        "|---|" + "---|" * len(ran),
    ]
    notes: list[str] = []
    verdicts: list[str] = []  # first: the 40-line cap must not drop them
    for name, w in workloads.items():
        health, ttfr = w["summary"].get("health", {}), w["summary"].get("time_to_first_result", {})
        cells = []
        for s in ran:
            h = health.get(s)
            if not h:
                cells.append("-")
                continue
            bad = h["failed"] or h["tracebacks"] or h["kcache_lines"]
            cell = f"{h['runs']}/{h['failed']}/{h['tracebacks']}/{h['kcache_lines']}"
            package = (f"; pkg {h['package_runs']}" if h.get("package_runs") else "") + ("; **NOT PAID**" if h.get("did_not_pay") else "")
            cells.append((f"**{cell}**" if bad else cell) + (f"; {ttfr[s]:.1f}" if s in ttfr else "") + package)
            verdicts += [f"- {name} {s}: Dynamo package did not pay: `{x[:200]}`" for x in h.get("did_not_pay", [])]
            for x in h.get("errors", []) + h["exceptions"][:2] + h["kcache_first"][:2]:
                notes.append(f"- {name} {s}: `{x[:200]}`")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for sk in w.get("skipped", []):
            notes.append(f"- {name} {sk['scenario']} round {sk['round']}: skipped ({sk['why']})")
    if notes or verdicts:
        lines += ["", "Exceptions, `kcache:` lines, skipped runs:", "", *list(dict.fromkeys(verdicts + notes))[:40]]
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict[str, Any]:
    import torch
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    if device == "cuda":
        env.update(gpu=torch.cuda.get_device_name(0), capability=".".join(map(str, torch.cuda.get_device_capability(0))), cuda=torch.version.cuda)
    for name in ("transformers", "timm", "torchvision"):
        try:
            env[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            env[name] = None
    return env


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["workloads"])
    shown = [s for s in SCENARIOS if any(results["workloads"][w]["summary"].get(s) for w in names)]
    if not shown:
        return
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(shown)
    for i, scenario in enumerate(shown):
        values = [results["workloads"][w]["summary"].get(scenario) or 0 for w in names]
        bars = ax.bar([x + i * width for x in range(len(names))], values, width, label=scenario)
        ax.bar_label(bars, fmt="%.1f", fontsize=6)
    ax.set_xticks([x + width * (len(shown) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylabel("first torch.compile call (s), median")
    env = results["environment"]
    ax.set_title(f"kcache fleet warm start — {env.get('gpu', env.get('device'))}, torch {env['torch']}, triton {env['triton']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def workload_specs() -> dict[str, Any]:
    """``bench.gpu_workloads.WORKLOADS`` (the orchestrator reads their needs and estimates).
    Run as a script (``python bench/gpu_e2e.py``) the repo root is not on ``sys.path``: the
    module is then loaded from its file, under its own name (nodes import it from PYTHONPATH)."""
    try:
        from bench.gpu_workloads import WORKLOADS as specs
    except ModuleNotFoundError:
        name = "_kcache_bench_gpu_workloads"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("gpu_workloads.py"))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        specs = module.WORKLOADS
    return dict(specs)


def preflight(workloads: list[str]) -> list[str]:
    """The workloads whose modules are importable here (a missing one is named, not fatal)."""
    specs = workload_specs()
    runnable = []
    for w in workloads:
        base, _, variant = w.partition("@")
        spec = specs.get(base)
        if spec is None or (variant and variant not in VARIANTS):
            log(f"unknown workload {w} (known: {', '.join(specs)}; variants @{', @'.join(VARIANTS)}): skipped")
            continue
        missing = [need for need in spec.needs if not any(importlib.util.find_spec(m) for m in need.split("|"))]
        if missing:
            log(f"[{w}] needs {', '.join(missing)}, not importable here: skipped")
            continue
        runnable.append(w)
    return runnable


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--device", default="cuda")
    p.add_argument("--work-dir", default="/tmp/kcache-gpu-e2e")
    p.add_argument("--timeout", type=int, default=420, help="per process")
    p.add_argument("--tag", default="", help="suffix for the result file names")
    p.add_argument("--scenarios", default="", help="scenarios to run, in this order (each after its prerequisite; see PREREQ)")
    p.add_argument("--repeats", type=int, default=0, help="extra rounds of the repeated scenarios, round-robin (medians of 1 + N runs)")
    p.add_argument("--repeat-cold", action="store_true", help="repeat cold and populate too (a fresh node each; populate against an empty service)")
    p.add_argument("--interleave-workloads", action="store_true", help="round k of every workload before round k+1 (default: one workload after the other)")
    p.add_argument("--budget-s", type=float, default=0, help="stop starting runs that would end after this many seconds from start; the table still prints")
    p.add_argument("--sizes", default="", help="workload size overrides, e.g. layers=2,hidden=128 (bench/gpu_workloads.py)")
    p.add_argument("--precompile-workloads", default="", help="run the precompile scenarios only for these workloads")
    p.add_argument("--force-precompile", action="store_true", help="run the precompile scenarios also for workloads torch 2.11 cannot package")
    p.add_argument("--merge", nargs="+", help="merge result files (several calls or GPUs) into gpu_e2e<tag>.json, the table and the plot")
    p.add_argument("--profile", default="", help="scenarios to rerun under cProfile (profile text in <out>/profiles)")
    p.add_argument(
        "--default-env",
        action="store_true",
        help="nodes as users run them: own HOME and TMPDIR, no TORCHINDUCTOR_CACHE_DIR/TRITON_CACHE_DIR/KCACHE_LOCAL_DIR; kcache-warm sets KCACHE_WORKLOAD",
    )
    p.add_argument("--child")
    p.add_argument("--child-out")
    args = p.parse_args()
    if args.child:
        child(args.child, args.device, Path(args.child_out), args.sizes)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"environment": {}, "workloads": {}}
    if args.merge:
        merged = [json.loads(Path(f).read_text()) for f in args.merge]
        results = merged[0]
        for extra in merged[1:]:
            results["workloads"].update(extra["workloads"])
        for workload in results["workloads"].values():  # also for files cut off before their summary
            workload["summary"] = summarize(workload["runs"])
        results["environment"]["merged_from"] = [Path(f).name for f in args.merge]
        args.workloads = ""  # writes gpu_e2e<tag>.json/.md/.png below
    else:
        results["environment"] = environment(args.device) | {
            "device": args.device,
            "date": time.strftime("%Y-%m-%d"),
            "environment": "default" if args.default_env else "explicit dirs",
            "argv": sys.argv[1:],
        }
    results_file = out / f"gpu_e2e{args.tag}.json"

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    budget = Budget(args.budget_s or None)
    selected = [s for s in args.scenarios.split(",") if s] or list(SCENARIOS)
    unknown = [s for s in selected if s not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    benches: list[WorkloadBench] = []
    for workload in preflight([w for w in args.workloads.split(",") if w]):
        def save(partial: dict[str, Any], workload: str = workload) -> None:
            results["workloads"][workload] = partial
            results_file.write_text(json.dumps(results, indent=1))

        benches.append(WorkloadBench(workload, args, budget, save, selected))
    if benches:
        log(f"workloads {[b.workload for b in benches]}, rounds {1 + args.repeats}, order per workload {benches[0].order}, "
            f"repeated {benches[0].repeated}, budget {args.budget_s or 'none'} s")
    try:
        if args.interleave_workloads:
            for k in range(1 + args.repeats):
                for b in benches:
                    b.run_round(k)
        else:
            for b in benches:
                for k in range(1 + args.repeats):
                    b.run_round(k)
                if not args.profile:
                    b.stop()
        if args.profile:
            for b in benches:
                b.run_profiled(args.profile.split(","), out / "profiles")
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}): the table below has what ran")
    finally:
        for b in benches:
            b.stop()
            results["workloads"].setdefault(b.workload, b.result)["summary"] = summarize(b.runs)
        if results["workloads"]:
            results_file.write_text(json.dumps(results, indent=1))
    try:
        plot(results, out / f"gpu_e2e{args.tag}.png")
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    table = markdown_table(results)
    (out / f"gpu_e2e{args.tag}.md").write_text(table)
    log(f"done: {results_file}")
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
