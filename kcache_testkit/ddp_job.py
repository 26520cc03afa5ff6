"""One rank of a data-parallel train step under ``torch.compile``: a user's multi-rank job.

Started by ``torchrun`` or as a plain interpreter with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
``MASTER_ADDR``/``MASTER_PORT`` set by hand (:mod:`kcache_testkit.ranks` does both); kcache only
through the environment (its ``.pth`` hook and ``KCACHE_URL``), as a user has it.

The step: ``torch.compile(DDP(CausalLMLoss(model)))`` on this rank's batch (the same weights on
every rank, a batch seeded by the rank), backward (DDP all-reduces the gradients: NCCL on
``--device cuda`` with one GPU per rank, gloo on ``--device cpu``), one SGD step. Its first call
compiles, forward and backward. ``first_step_s`` is the time from ``torch.compile``'s wrapping to
the step's result on the host, after a barrier so every rank starts it together.

Writes ``<out>/rank<RANK>.json``: the first step's seconds, the wall clock of its result, the
output (loss, gradient norm, parameter sum after the step: floats, compared exactly across
runs), kcache's per-layer stats of this process (None when kcache is not active), Inductor's
cache counters, and where this process's caches were.

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python -m kcache_testkit.ddp_job --device cpu --model mlp-lm --out DIR
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # after site (kcache's .pth hook has run): the interpreter's own start

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


def parse_sizes(text: str) -> dict[str, int]:
    """``"layers=2,hidden=64"`` -> ``{"layers": 2, "hidden": 64}``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        out[key.strip()] = int(value)
    return out


def _kcache_report() -> dict[str, Any] | None:
    """This process's kcache stats, after flushing its uploads and publishing its workload
    (what exit would do; done here so the report has them). None: kcache is not active."""
    try:
        from kcache.current import get_runtime
    except ImportError:
        return None
    rt = get_runtime()
    if rt is None:
        return None
    prefetch = None
    if rt.prefetcher is not None:
        prefetch = {"seconds": round(rt.prefetcher.seconds, 3), "counts": rt.prefetcher.counts, "following": rt.prefetcher.following}
    rt.close()
    layers = {name: c.model_dump() for name, c in rt.stats.snapshot().items()}
    return {"layers": layers, "prefetch": prefetch, "prefetch_owner_pid": os.environ.get("KCACHE_PREFETCH_PID")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--model", default="llama", help="a name of kcache_testkit.models.SIZES")
    p.add_argument("--sizes", default="")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    t_import = time.perf_counter()
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kcache_testkit.models import SIZES, CausalLMLoss, build

    import_s = time.perf_counter() - t_import
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    t_init = time.perf_counter()
    dist.init_process_group("nccl" if cuda else "gloo")
    init_s = time.perf_counter() - t_init

    sizes = {**SIZES[args.model], **parse_sizes(args.sizes)}
    torch.manual_seed(0)  # the same weights on every rank (DDP also broadcasts rank 0's)
    model, vocab = build(args.model, device, sizes)
    model.train()
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
    ids = torch.randint(0, vocab, (sizes["batch"], sizes["seq"]), generator=generator).to(device)
    ddp = DDP(CausalLMLoss(model), device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    # NCCL's barrier on this rank's GPU (named: torch would otherwise guess and warn).
    barrier_kw: dict[str, Any] = {"device_ids": [local_rank]} if cuda else {}
    dist.barrier(**barrier_kw)  # every rank ready: the first step's time is this rank's compile, not a late peer
    if cuda:
        torch.cuda.synchronize()

    t0, t0_wall = time.perf_counter(), time.time()
    compiled = torch.compile(ddp)
    loss = compiled(ids)
    loss.backward()
    grad_norm = torch.cat([q.grad.flatten() for q in params if q.grad is not None]).float().norm()
    opt.step()
    out = torch.stack([loss.detach().float(), grad_norm, torch.stack([q.detach().float().sum() for q in params]).sum()])
    values = out.cpu().tolist()  # waits for the device
    first_step_s = time.perf_counter() - t0
    first_result_at = time.time()

    report: dict[str, Any] = {
        "rank": rank, "world_size": world, "local_rank": local_rank, "pid": os.getpid(), "device": str(device),
        "model": args.model, "sizes": sizes,
        "first_step_s": first_step_s, "first_step_started": t0_wall, "first_result_at": first_result_at,
        "interpreter_started_at": STARTED_AT, "import_torch_s": round(import_s, 3), "init_process_group_s": round(init_s, 3),
        "output": values,
        "kcache": _kcache_report(),
        "inductor": {k: v for k, v in counters["inductor"].items() if "cache" in k},
        "aot_autograd": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
        "env": {k: os.environ.get(k) for k in ("HOME", "TMPDIR", "OMP_NUM_THREADS", "KCACHE_URL", "KCACHE_WORKLOAD", "TORCHELASTIC_RUN_ID")},
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out_dir / f"rank{rank}.json")
    dist.barrier(**barrier_kw)  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
