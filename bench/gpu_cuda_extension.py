"""GPU proof of the ``jit`` layer's extension adapter: a CUDA ``load_inline`` extension (nvcc +
c++, ninja), cold on one node, then fresh nodes served by kcache, in one run (issue #29).

Every node is a fresh interpreter in the user's default environment (its own ``HOME`` and
``TMPDIR``, kcache activated by ``KCACHE_URL`` alone) against one ``kcache serve`` on the embedded
default. A ``PATH`` shim (:mod:`kcache_testkit.compilers`) counts every compiler run. Scenarios:

* ``cold``          kcache on, empty service: builds with nvcc and c++, uploads the library
* ``kcache-warm``   a fresh node (``--repeats`` of them): the library from kcache, no compiler
* ``copied-warm``   a fresh node, kcache off, the cold node's ``~/.cache/torch_extensions`` copied in

    python -m bench.gpu_cuda_extension [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kcache_testkit.compilers import make_shim
from kcache_testkit.nodes import Node
from kcache_testkit.ports import free_port
from kcache_testkit.service import kcache_cmd

JOB = r'''
import json, time, torch
from torch.utils.cpp_extension import load_inline
CUDA = """
__global__ void scaled_add_kernel(const float* x, const float* y, float* out, float alpha, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + alpha * y[i];
}
torch::Tensor scaled_add(torch::Tensor x, torch::Tensor y, double alpha) {
  auto out = torch::empty_like(x);
  int n = x.numel();
  scaled_add_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), (float)alpha, n);
  return out;
}
"""
CPP = "torch::Tensor scaled_add(torch::Tensor x, torch::Tensor y, double alpha);"
t0 = time.perf_counter()
ext = load_inline(name="kcache_cuda_scaled_add", cpp_sources=[CPP], cuda_sources=[CUDA], functions=["scaled_add"])
load_s = time.perf_counter() - t0
x = torch.arange(8.0, device="cuda"); y = torch.ones(8, device="cuda")
out = ext.scaled_add(x, y, 0.5).cpu().tolist()
print("RESULT " + json.dumps({"load_s": load_s, "out": out}))
'''


def run_node(node: Node, shim_dir: Path, **env: str) -> dict[str, object]:
    shim = make_shim(shim_dir)
    node_env = node.env(PATH=shim.path(), **env)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, env=node_env, cwd=node.root, timeout=600)
    wall = time.perf_counter() - t0
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    result = json.loads(line[len("RESULT "):]) if line else {}
    return {
        "rc": proc.returncode, "wall_s": round(wall, 2), "load_s": round(float(result.get("load_s", float("nan"))), 3),
        "out": result.get("out"), "builds": len(shim.builds()), "compiler_runs": len(shim.calls()),
        "nvcc_builds": sum(1 for c in shim.builds() if c[0] == "nvcc"),
        "tracebacks": proc.stderr.count("Traceback"), "kcache_lines": [ln for ln in proc.stderr.splitlines() if "kcache:" in ln][:3],
        "stderr_tail": proc.stderr[-800:] if proc.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kcache-cuda-ext-"))
    port = free_port()
    server = subprocess.Popen(
        [*kcache_cmd(), "serve", "--port", str(port), "--data-dir", str(root / "service")],
        stdout=subprocess.DEVNULL, stderr=open(root / "service.log", "w"),  # noqa: SIM115
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        for _ in range(200):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        rows: dict[str, list[dict[str, object]]] = {}
        cold = Node(root / "cold")
        rows["cold"] = [run_node(cold, root / "shim-cold", KCACHE_URL=url)]
        print("cold", rows["cold"][0], flush=True)
        time.sleep(1.0)  # the cold node's upload is flushed at its exit; let the service commit it
        copied = Node(root / "copied")
        src = cold.home / ".cache" / "torch_extensions"
        if src.is_dir():
            shutil.copytree(src, copied.home / ".cache" / "torch_extensions", symlinks=True)
        for i in range(args.repeats):
            node = Node(root / f"kcache-warm-{i}")
            rows.setdefault("kcache-warm", []).append(run_node(node, root / f"shim-kw{i}", KCACHE_URL=url))
            print(f"kcache-warm-{i}", rows["kcache-warm"][-1], flush=True)
        rows["copied-warm"] = [run_node(copied, root / "shim-copied")]
        print("copied-warm", rows["copied-warm"][0], flush=True)
    finally:
        server.terminate()
        server.wait(timeout=20)
    print("\n| scenario | load_inline s (median, runs) | compiler builds (nvcc) | same output as cold | rc |")
    print("|---|---|---|---|---|")
    reference = rows["cold"][0]["out"]
    for name, runs in rows.items():
        loads = [float(r["load_s"]) for r in runs]  # type: ignore[arg-type]
        print(f"| {name} | {statistics.median(loads):.3f} ({', '.join(f'{v:.2f}' for v in loads)}) | "
              f"{', '.join(str(r['builds']) for r in runs)} ({', '.join(str(r['nvcc_builds']) for r in runs)}) | "
              f"{all(r['out'] == reference for r in runs)} | {', '.join(str(r['rc']) for r in runs)} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_cuda_extension.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
