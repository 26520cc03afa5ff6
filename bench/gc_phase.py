"""Does a first ``torch.compile`` call's garbage-collector work depend on kcache, or on any few
thousand objects more in the heap? (issue 26: on this CPU every kcache-warm run of bert-dynamic
made two full collections in its first call, every copied-warm run one.)

Each run is a fresh interpreter **without kcache** (``KCACHE_URL`` unset) that builds the workload,
keeps N extra small objects alive (``--ballast``, a list of one-element lists: objects the collector
tracks, as an imported client's are), then makes the first call with warm local caches (the first
run warms them) and prints, from ``bench/first_call_probe.py``, the call's time, the collector's time
and its collections by generation. A full collection runs when the long-lived heap grew by a
quarter since the last one, so the count in a given call flips as N crosses such a point: if it
flips for N near kcache's own (``bench/gpu_phases.py``'s "objects the collector tracks" row,
kcache-warm minus copied-warm), kcache's extra collection is that and nothing of kcache's doing.

    python -m bench.gc_phase --workload bert-dynamic --device cpu --ballast 0,6000,12000,24000,48000,96000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_NODE = """
import json, os, sys, time
import torch, torch._dynamo, torch._inductor.compile_fx
from bench.first_call_probe import FirstCallProbe
from bench.gpu_workloads import build

step, inputs, _ = build(sys.argv[1], sys.argv[2])
ballast = [[i] for i in range(int(sys.argv[3]))]
probe = FirstCallProbe()
probe.start()
step(inputs)
if sys.argv[2] == "cuda":
    torch.cuda.synchronize()
print("PROBE " + json.dumps(probe.stop()))
"""


def run(workload: str, device: str, ballast: int, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _NODE, workload, device, str(ballast)], env=env,
                         capture_output=True, text=True, cwd=REPO, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("PROBE "))
    return json.loads(line[len("PROBE "):])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="bert-dynamic")
    p.add_argument("--device", default="cpu")
    p.add_argument("--ballast", default="0,6000,12000,24000,48000,96000", help="extra objects per run, comma-separated")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kcache-gc-phase-") as tmp:
        # One warm cache for every run (the first run fills it), no kcache, nothing of the caller's.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TORCHINDUCTOR_", "TRITON_"))}
        env |= {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"), "TRITON_CACHE_DIR": str(Path(tmp) / "triton"),
                "PYTHONPATH": str(REPO)}
        run(args.workload, args.device, 0, env)  # warms the caches; not reported
        print("| extra objects | first call s | collector s | full collections | objects tracked at the call |")
        print("|---|---|---|---|---|")
        for n in (int(x) for x in args.ballast.split(",")):
            r = run(args.workload, args.device, n, env)
            print(f"| {n} | {r['wall_s']:.2f} | {r['gc_s']:.2f} | {r['gc_collections'][2]} | {r['gc_objects_at_start']} |", flush=True)  # type: ignore[index]


if __name__ == "__main__":
    main()
