"""Multi-rank proof (issue 33): one download per node per artifact, both ranks hit, same outputs.

A 2-rank data-parallel train step under ``torch.compile`` (``kcache_testkit/ddp_job.py``: DDP of
a transformers Llama from a config, or the torch-only ``mlp-lm`` where transformers is missing;
NCCL with one GPU per rank on ``--device cuda``, gloo on ``--device cpu``), started the two ways
users start ranks (``kcache_testkit/ranks.py``): ``torchrun --nproc-per-node 2`` and two
independent interpreters with ``RANK``/``WORLD_SIZE``/... set by hand (no common parent).

Every node is fresh (its own ``HOME`` and ``TMPDIR``, no cache dir variable), kcache activated by
its ``.pth`` hook as a user who installed the wheel has it, with ``KCACHE_URL`` and
``KCACHE_WORKLOAD`` only. One embedded ``kcache serve`` with its download log on
(``KCACHE_DOWNLOAD_LOG=1``: a line per pack or entry handed out, with its key):

* ``populate``     a fresh node (``--modes``' first launch), kcache on: fills the service and
                   publishes the workload (``KCACHE_FLUSH_TIMEOUT_S=60`` there only, so every
                   upload lands before its exit).
* ``cold``         a fresh node, kcache not active (no ``KCACHE_*`` at all).
* ``local-warm``   the cold node again, its caches kept (kcache not active): the limit.
* ``kcache-warm``  a fresh node, kcache on, the service filled. The service's download log
                   during its run is the node's downloads, per artifact.

Round 0 runs populate, then per launch mode cold, local-warm, kcache-warm; rounds 1..``--repeats``
run local-warm and kcache-warm again per mode (interleaved, a fresh node for each kcache-warm);
then ``--cold-repeats`` more cold nodes per mode, where the budget leaves room. Per rank: the
first step's seconds (``torch.compile`` wrapping + the first train step, after a barrier), time
to first result from the launch, the output (loss, grad norm, parameter sum) against populate's
same rank (exact), kcache's own per-layer stats (hits, misses, errors, bytes), Inductor's cache
counters. Per kcache-warm node: downloads per artifact, against the workload's manifest.

Writes ``<out>/gpu_multirank<tag>.json`` and ``.md`` (the tables, also printed last).

    python -m bench.gpu_multirank --device cuda --out $OUT --repeats 2 --budget-s 480
    python -m bench.gpu_multirank --device cpu --model mlp-lm --out /tmp/mr --repeats 1   # on a CPU
    bash bench/results/gpu/run_issue33.sh TAG [BUDGET_S]   # one device call (2 GPUs)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.gpu_e2e import Budget, environment, log, stderr_summary
from kcache_testkit.download_log import DownloadLog, Slice
from kcache_testkit.nodes import Node
from kcache_testkit.ranks import MODES, launch
from kcache_testkit.service import ServerProcess, server_env

SCENARIOS = ("populate", "cold", "local-warm", "kcache-warm")
HEAVY = ("populate", "cold")  # they compile
WORKLOAD = "issue33-ddp"


@dataclass
class Plan:
    scenario: str
    mode: str
    node: str
    round: int
    settings: dict[str, str] = field(default_factory=dict)


def plans(modes: list[str], repeats: int, cold_repeats: int) -> list[Plan]:
    """Round 0, the warm rounds (interleaved), then the extra cold nodes (see the module doc)."""
    out = [Plan("populate", modes[0], "populate", 0)]
    for k in range(1 + repeats):
        for m in modes:
            if k == 0:
                out.append(Plan("cold", m, f"cold-{m}", 0))
            out.append(Plan("local-warm", m, f"cold-{m}", k))  # the cold node again
            out.append(Plan("kcache-warm", m, f"kcache-warm-{m}-{k}", k))
    for k in range(1, 1 + cold_repeats):
        for m in modes:
            out.append(Plan("cold", m, f"cold-{m}-{k}", k))
    return out


class MultiRankBench:
    def __init__(self, args: argparse.Namespace, budget: Budget) -> None:
        self.args, self.budget = args, budget
        self.root = Path(args.work_dir)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        svc = self.root / "service"
        self.service = ServerProcess(svc / "data", svc, env=server_env(svc, KCACHE_LOG_LEVEL="info", KCACHE_DOWNLOAD_LOG="1"),
                                     name="kcache").start()
        self.downloads = DownloadLog(self.service.log)
        self.job_args = ["--device", args.device, "--model", args.model] + (["--sizes", args.sizes] if args.sizes else [])
        self.runs: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.walls: dict[str, list[float]] = {}
        self.populate_out: list[list[float] | None] | None = None
        self.manifest: dict[str, Any] | None = None

    def stop(self) -> None:
        self.service.stop()

    def estimate(self, scenario: str) -> float:
        if mine := self.walls.get(scenario):
            return max(mine)
        heavy = scenario in HEAVY
        seen = [w for s, ws in self.walls.items() if (s in HEAVY) == heavy for w in ws]
        if seen:
            return max(seen)
        return self.args.est_cold_s if heavy else self.args.est_warm_s

    def settings(self, plan: Plan) -> dict[str, str]:
        if plan.scenario in ("cold", "local-warm"):
            return {}  # kcache not active: no KCACHE_URL
        on = {"KCACHE_URL": self.service.url, "KCACHE_WORKLOAD": WORKLOAD}
        return on | {"KCACHE_FLUSH_TIMEOUT_S": "60"} if plan.scenario == "populate" else on

    def run(self, plan: Plan) -> None:
        label = f"{plan.scenario}/{plan.mode}/r{plan.round}"
        if plan.scenario in ("local-warm", "kcache-warm") and not self._ok(*self._prereq(plan)):
            self._skip(plan, f"prerequisite {'/'.join(self._prereq(plan))} did not run or failed")
            return
        est, left = self.estimate(plan.scenario), self.budget.left()
        if left < est * 1.1:
            self._skip(plan, f"budget: {max(left, 0):.0f} s left, {est * 1.1:.0f} s needed")
            return
        node = Node(self.root / plan.node)
        out = node.root / f"out-{plan.scenario}-r{plan.round}"
        shutil.rmtree(out, ignore_errors=True)
        log(f"{label} ...")
        self.downloads.take()  # what came before this node is not its
        running = launch(node, plan.mode, out, self.job_args, self.args.nproc, **self.settings(plan))
        try:
            result = running.wait(min(self.args.timeout, max(left, 30.0)))
        except BaseException:
            running.kill()
            raise
        served = self.downloads.take()
        self.walls.setdefault(plan.scenario, []).append(result["wall_s"])
        text = "\n".join(Path(p).read_text(errors="replace") for p in result["logs"] if Path(p).exists())
        record: dict[str, Any] = {"scenario": plan.scenario, "mode": plan.mode, "round": plan.round, "node": plan.node, **result}
        record["stderr"] = stderr_summary(text)
        if plan.scenario == "populate" and result["ok"]:
            self.populate_out = [r["output"] if r else None for r in result["ranks"]]
            self.manifest = self._workload_manifest()
        record["ranks"] = [self._rank(r) for r in result["ranks"]]
        if plan.scenario in ("populate", "kcache-warm"):
            record["downloads"] = self._downloads(served)
        self.runs.append(record)
        log(f"{label}: {_one_line(record)}")

    def _prereq(self, plan: Plan) -> tuple[str, str]:
        return ("cold", plan.mode) if plan.scenario == "local-warm" else ("populate", self.args.modes[0])

    def _ok(self, scenario: str, mode: str) -> bool:
        return any(r["scenario"] == scenario and r["mode"] == mode and r["round"] == 0 and r["ok"] for r in self.runs)

    def _skip(self, plan: Plan, why: str) -> None:
        self.skipped.append({"scenario": plan.scenario, "mode": plan.mode, "round": plan.round, "why": why})
        log(f"{plan.scenario}/{plan.mode}/r{plan.round}: skipped ({why})")

    def _workload_manifest(self) -> dict[str, Any] | None:
        """The workload as a fresh node sees it (the newest environment's merged manifest)."""
        try:
            r = httpx.get(f"{self.service.url}/v1/default/workloads/{WORKLOAD}", timeout=30)
            return r.json() if r.status_code == 200 else {"status": r.status_code, "body": r.text[:500]}
        except httpx.HTTPError as exc:
            return {"error": repr(exc)}

    def _rank(self, report: dict[str, Any] | None) -> dict[str, Any] | None:
        if report is None:
            return None
        rank = report["rank"]
        out: dict[str, Any] = {k: report.get(k) for k in (
            "rank", "pid", "device", "first_step_s", "time_to_first_result_s", "import_torch_s", "init_process_group_s",
            "output", "inductor", "aot_autograd", "env")}
        ref = self.populate_out[rank] if self.populate_out and rank < len(self.populate_out) else None
        if ref is not None:
            mine = report["output"]
            out["output_equals_populate"] = mine == ref
            out["output_max_abs_diff"] = max(abs(a - b) for a, b in zip(mine, ref, strict=True))
        kc = report.get("kcache")
        if kc is not None:
            layers = kc["layers"]
            out["kcache"] = {
                "hits": sum(c["hits"] for c in layers.values()), "misses": sum(c["misses"] for c in layers.values()),
                "errors": sum(c["errors"] for c in layers.values()), "puts": sum(c["puts"] for c in layers.values()),
                "bytes_down": sum(c["bytes_down"] for c in layers.values()),
                "by_layer": {n: {k: c[k] for k in ("hits", "misses", "errors", "puts", "bytes_down")} for n, c in layers.items()},
                "miss_reasons": {n: c["miss_reasons"] for n, c in layers.items() if c["miss_reasons"]},
                "prefetch": kc["prefetch"], "prefetch_owner_pid": kc["prefetch_owner_pid"],
            }
        return out

    def _downloads(self, served: Slice) -> dict[str, Any]:
        """This node's downloads per artifact (the service's download log while it ran), against
        the workload's manifest (what a fresh node of the job needs)."""
        per = served.per_artifact()
        layers: dict[str, list[int]] = {}
        for (layer, _key), n in per.items():
            counts = layers.setdefault(layer, [0, 0])
            counts[0] += 1
            counts[1] += n
        out: dict[str, Any] = {
            "artifacts": len(per), "downloads": sum(per.values()), "max_per_artifact": max(per.values(), default=0),
            "by_layer": {layer: {"artifacts": a, "downloads": d} for layer, (a, d) in sorted(layers.items())},
            "more_than_once": [f"{layer}:{key}:{n}" for (layer, key), n in per.items() if n > 1][:20],
            "bytes": sum(d.size for d in served.downloads),
            "peers": len({d.peer for d in served.downloads}),
            "requests": {f"{m} {p} {s}": n for (m, p, s), n in sorted(served.requests.items()) if "/workloads/" in p or "batch-get" in p},
        }
        if self.manifest and "kernels" in self.manifest:
            wanted = {("kernel", k) for k in self.manifest["kernels"]} | {(e["layer"], e["key"]) for e in self.manifest["entries"]}
            out["manifest_artifacts"] = len(wanted)
            out["manifest_not_downloaded"] = len(wanted - set(per))
            out["downloaded_not_in_manifest"] = len(set(per) - wanted)
        return out


def _one_line(record: dict[str, Any]) -> str:
    err = record["stderr"]
    health = f"tb={err['tracebacks']} kcache:={err['kcache_lines']}"
    if not record["ok"]:
        lines = record.get("error", "").splitlines()
        return f"FAILED {lines[0] if lines else '?'} | {' / '.join(lines[-3:])[:300]} | wall {record['wall_s']:.0f} s {health}"
    parts = []
    for r in record["ranks"]:
        kc = r.get("kcache")
        same = r.get("output_equals_populate")
        parts.append(f"r{r['rank']} {r['first_step_s']:.2f} s" + (f" hits {kc['hits']} miss {kc['misses']} err {kc['errors']}" if kc else "")
                     + ("" if same is None else " out=" + ("same" if same else f"diff {r['output_max_abs_diff']:.3g}")))
    dl = record.get("downloads")
    if dl:
        parts.append(f"downloads {dl['downloads']} of {dl['artifacts']} artifacts (max {dl['max_per_artifact']}/artifact)")
    return "; ".join(parts) + f" | wall {record['wall_s']:.0f} s {health}"


# ---- summary ------------------------------------------------------------------------------------


def _stat(xs: list[float]) -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    return f"{med:.2f}" if len(xs) == 1 else f"{med:.2f} ({min(xs):.2f}-{max(xs):.2f}) x{len(xs)}"


def summarize(runs: list[dict[str, Any]], modes: list[str], nproc: int) -> dict[str, Any]:
    """Per (scenario, launch): first-step medians per rank and of the slower rank, runs and
    failures; per launch: downloads per kcache-warm node, hits per rank, outputs vs populate."""
    summary: dict[str, Any] = {"first_step": {}, "downloads": {}, "hits": {}, "health": {}}
    for scenario in SCENARIOS:
        for mode in modes:
            mine = [r for r in runs if r["scenario"] == scenario and r["mode"] == mode]
            if not mine:
                continue
            ok = [r for r in mine if r["ok"]]
            per_rank = [[r["ranks"][i]["first_step_s"] for r in ok] for i in range(nproc)]
            slowest = [max(x["first_step_s"] for x in r["ranks"]) for r in ok]
            ttfr = [max(x["time_to_first_result_s"] for x in r["ranks"]) for r in ok]
            outs = [x.get("output_equals_populate") for r in ok for x in r["ranks"]]
            summary["first_step"][f"{scenario}/{mode}"] = {
                "per_rank": [{"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None for xs in per_rank],
                "slowest_rank_median": statistics.median(slowest) if slowest else None,
                "time_to_first_result_median": statistics.median(ttfr) if ttfr else None,
                "runs": per_rank,
            }
            summary["health"][f"{scenario}/{mode}"] = {
                "runs": len(mine), "failed": len(mine) - len(ok),
                "tracebacks": sum(r["stderr"]["tracebacks"] for r in mine),
                "kcache_lines": sum(r["stderr"]["kcache_lines"] for r in mine),
                "outputs_equal_populate": f"{sum(o is True for o in outs)}/{sum(o is not None for o in outs)}",
                "kcache_first": list(dict.fromkeys(x for r in mine for x in r["stderr"]["kcache_first"]))[:4],
                "exceptions": list(dict.fromkeys(x for r in mine for x in r["stderr"]["exceptions"]))[:4],
                "errors": [r.get("error", "")[:300] for r in mine if not r["ok"]][:2],
            }
            if scenario == "kcache-warm" and ok:
                dls = [r["downloads"] for r in ok]
                summary["downloads"][mode] = {
                    "nodes": len(dls),
                    "artifacts_per_node": [d["artifacts"] for d in dls],
                    "downloads_per_node": [d["downloads"] for d in dls],
                    "max_downloads_of_one_artifact_in_a_node": max(d["max_per_artifact"] for d in dls),
                    "by_layer": dls[-1]["by_layer"],
                    "manifest_artifacts": dls[-1].get("manifest_artifacts"),
                    "manifest_not_downloaded": [d.get("manifest_not_downloaded") for d in dls],
                    "manifest_gets_per_node": [sum(n for k, n in d["requests"].items() if "/workloads/" in k and k.startswith("GET")) for d in dls],
                    "batch_gets_per_node": [sum(n for k, n in d["requests"].items() if "batch-get" in k) for d in dls],
                    "bytes_per_node": [d["bytes"] for d in dls],
                }
                summary["hits"][mode] = [_hits(i, [r["ranks"][i] for r in ok]) for i in range(nproc)]
    return summary


def _prefetch_role(kc: dict[str, Any]) -> str:
    """Who prefetched the workload for this rank: itself (``led``), another process of the node
    that held the node's claim (``followed``), or the process that started it (``parent``:
    torchrun's agent, whose children inherit its claim)."""
    pf = kc.get("prefetch")
    if pf is not None:
        return "followed" if pf.get("following") else "led"
    return "parent" if kc.get("prefetch_owner_pid") else "none"


def _hits(rank: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's kcache stats over its kcache-warm runs (a list per count, one per node)."""
    kc = [r.get("kcache") or {} for r in runs]
    return {
        "rank": rank,
        **{k: [c.get(k, 0) for c in kc] for k in ("hits", "misses", "errors", "bytes_down")},
        "by_layer": kc[-1].get("by_layer", {}),
        "fx_graph": [(r["inductor"].get("fxgraph_cache_hit", 0), r["inductor"].get("fxgraph_cache_miss", 0)) for r in runs],
        "prefetch": [_prefetch_role(c) for c in kc],
        "outputs_equal_populate": [r.get("output_equals_populate") for r in runs],
    }


def markdown(results: dict[str, Any]) -> str:
    env, s = results["environment"], results["summary"]
    modes, nproc = results["config"]["modes"], results["config"]["nproc"]
    lines = [
        f"## kcache multi-rank (issue 33) - {env.get('gpu', env.get('device', '?'))} x{nproc} ranks, torch {env.get('torch', '?')}, "
        f"triton {env.get('triton', '?')}, model {results['config']['model']} {results['config']['sizes']}, {env.get('date', '')}",
        "",
        "First step (torch.compile wrapping + first DDP train step, after a barrier), s: median (min-max) xn per rank; "
        "the job's (slower rank's) median, and the median from the node's launch to its last rank's result",
        "",
        "| launch | " + " | ".join(sc for sc in ("cold", "local-warm", "kcache-warm", "populate")) + " |",
        "|---|---|---|---|---|",
    ]
    for mode in modes:
        cells = []
        for sc in ("cold", "local-warm", "kcache-warm", "populate"):
            fs = s["first_step"].get(f"{sc}/{mode}")
            if not fs or fs["slowest_rank_median"] is None:
                cells.append("-" if f"{sc}/{mode}" not in s["health"] else "failed")
                continue
            cells.append("<br>".join(f"r{i}: {_stat(xs)}" for i, xs in enumerate(fs["runs"])) + f"<br>**job {fs['slowest_rank_median']:.2f}**"
                         + f" (launch to result {fs['time_to_first_result_median']:.1f})")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Downloads per kcache-warm node (the service's download log while the node ran; an artifact = a kernel pack or a cache entry)",
        "",
        "| launch | nodes | workload artifacts | downloaded per node: artifacts / downloads | max downloads of one artifact in a node | by layer (artifacts/downloads, last node) | manifest artifacts not downloaded | workload manifest GETs / batch-gets per node | MB per node |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        d = s["downloads"].get(mode)
        if not d:
            lines.append(f"| {mode} | 0 | - | - | - | - | - | - | - |")
            continue
        by_layer = ", ".join(f"{k} {v['artifacts']}/{v['downloads']}" for k, v in d["by_layer"].items())
        lines.append(
            f"| {mode} | {d['nodes']} | {d['manifest_artifacts']} | "
            + ", ".join(f"{a}/{n}" for a, n in zip(d["artifacts_per_node"], d["downloads_per_node"], strict=True))
            + f" | **{d['max_downloads_of_one_artifact_in_a_node']}** | {by_layer} | {', '.join(map(str, d['manifest_not_downloaded']))} | "
            + ", ".join(f"{g}/{b}" for g, b in zip(d["manifest_gets_per_node"], d["batch_gets_per_node"], strict=True))
            + " | " + ", ".join(f"{b / 1e6:.1f}" for b in d["bytes_per_node"]) + " |"
        )
    lines += [
        "",
        "Hits per rank on kcache-warm nodes (kcache's own stats, per node; Inductor FX-graph cache hit/miss; output == populate's same rank, exact)",
        "",
        "| launch | rank | kcache hits | misses | errors | MB from kcache (tier or service) | by layer (hits/misses, last node) | FX graph hit/miss | prefetch | output == populate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def join(xs: list[Any]) -> str:
        return ", ".join(str(x) for x in xs)

    for mode in modes:
        for h in s["hits"].get(mode, []):
            by_layer = ", ".join(f"{k} {v['hits']}/{v['misses']}" for k, v in h["by_layer"].items() if v["hits"] or v["misses"])
            lines.append(
                f"| {mode} | {h['rank']} | {join(h['hits'])} | {join(h['misses'])} | {join(h['errors'])} | "
                + join([f"{b / 1e6:.2f}" for b in h["bytes_down"]]) + f" | {by_layer} | "
                + join([f"{a}/{b}" for a, b in h["fx_graph"]]) + f" | {join(h['prefetch'])} | {join(h['outputs_equal_populate'])} |"
            )
    lines += ["", "Health: runs / failed / Traceback lines / `kcache:` lines; outputs equal to populate's (rank-runs)", "",
              "| scenario/launch | health | outputs == populate |", "|---|---|---|"]
    notes = []
    for key, h in s["health"].items():
        bad = h["failed"] or h["tracebacks"] or h["kcache_lines"]
        cell = f"{h['runs']}/{h['failed']}/{h['tracebacks']}/{h['kcache_lines']}"
        lines.append(f"| {key} | {f'**{cell}**' if bad else cell} | {h['outputs_equal_populate']} |")
        for x in [e.splitlines()[0] for e in h["errors"] if e] + h["exceptions"][:2] + h["kcache_first"][:2]:
            notes.append(f"- {key}: `{x[:240]}`")
    for sk in results.get("skipped", []):
        notes.append(f"- {sk['scenario']}/{sk['mode']} round {sk['round']}: skipped ({sk['why']})")
    if notes:
        lines += ["", "Errors, exceptions, `kcache:` lines, skipped runs:", "", *list(dict.fromkeys(notes))[:30]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    has_transformers = importlib.util.find_spec("transformers") is not None
    p.add_argument("--model", default="llama" if has_transformers else "mlp-lm", help="llama (transformers) or mlp-lm (torch only)")
    p.add_argument("--sizes", default="", help="model size overrides, e.g. layers=2,hidden=128 (kcache_testkit/models.py)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--repeats", type=int, default=2, help="extra rounds of local-warm and kcache-warm (medians of 1 + N)")
    p.add_argument("--cold-repeats", type=int, default=2, help="extra cold nodes per launch, after the warm rounds, budget permitting")
    p.add_argument("--budget-s", type=float, default=0, help="start no run that would end after this many seconds; the table still prints")
    p.add_argument("--est-cold-s", type=float, default=90, help="a compiling node's wall before one ran (budget)")
    p.add_argument("--est-warm-s", type=float, default=45, help="a warm node's wall before one ran (budget)")
    p.add_argument("--timeout", type=float, default=300, help="per node, seconds")
    p.add_argument("--work-dir", default="/tmp/kcache-multirank")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default="")
    p.add_argument("--table", metavar="JSON", help="print the tables of a result file again (its summary recomputed), run nothing")
    args = p.parse_args()
    if args.table:
        saved = json.loads(Path(args.table).read_text())
        saved["summary"] = summarize(saved.get("runs", []), saved["config"]["modes"], saved["config"]["nproc"])
        print(markdown(saved), end="")
        return 0
    args.modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in args.modes if m not in MODES]:
        raise SystemExit(f"unknown launch modes {unknown}; known: {', '.join(MODES)}")
    if args.model == "llama" and not has_transformers:
        raise SystemExit("--model llama needs transformers; --model mlp-lm needs torch only")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    results: dict[str, Any] = {
        "environment": environment(args.device) | {"device": args.device, "date": time.strftime("%Y-%m-%d")},
        "config": {"model": args.model, "sizes": args.sizes, "nproc": args.nproc, "modes": args.modes, "repeats": args.repeats,
                   "cold_repeats": args.cold_repeats, "workload": WORKLOAD},
    }
    results_file = out / f"gpu_multirank{args.tag}.json"
    todo = plans(args.modes, args.repeats, args.cold_repeats)
    log(f"{len(todo)} node runs planned: {', '.join(f'{p.scenario}/{p.mode}/r{p.round}' for p in todo)}; budget {args.budget_s or 'none'} s")
    bench = MultiRankBench(args, Budget(args.budget_s or None))
    try:
        for plan in todo:
            bench.run(plan)
            results |= {"runs": bench.runs, "skipped": bench.skipped, "manifest": bench.manifest}
            results_file.write_text(json.dumps(results, indent=1))
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}): the table below has what ran")
    finally:
        bench.stop()
    results |= {"runs": bench.runs, "skipped": bench.skipped, "manifest": bench.manifest}
    results["summary"] = summarize(bench.runs, args.modes, args.nproc)
    results_file.write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (out / f"gpu_multirank{args.tag}.md").write_text(table)
    log(f"done: {results_file}")
    print(table, flush=True)
    failed = [r for r in bench.runs if not r["ok"]]
    return 1 if failed or not bench.runs else 0


if __name__ == "__main__":
    raise SystemExit(main())
