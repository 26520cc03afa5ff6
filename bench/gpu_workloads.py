"""The workloads of ``bench/gpu_e2e.py``: each builds a model and a ``step`` whose first call is
what a job does before its first result (``torch.compile`` compiles inside it).

Imported only by a benchmark node (the child process), never by the orchestrator. timm,
torchvision and transformers are imported lazily, by the workloads that use them; models are
built from code (random weights, ``from_config``): nothing is downloaded.

Sizes are parameters (``--sizes layers=2,hidden=128`` on gpu_e2e.py's command line overrides the
defaults of every workload that has that parameter); ``WORKLOADS[name].sizes`` lists them.
Cold compile on an H100 at the defaults is meant to stay under ~60 s per workload
(``bench/results/gpu/README.md`` has the measured ones).

| name | what it exercises |
|---|---|
| ``resnet50``         | CNN inference, default mode (timm; torchvision's resnet50 where timm is missing) |
| ``gpt2-train``       | transformers GPT-2 train step (forward + backward), default mode |
| ``gpt2-autotune``    | GPT-2 inference, ``max-autotune-no-cudagraphs`` (~120 s cold at 6 layers) |
| ``triton-op``        | a user Triton kernel through ``triton_op``/``wrap_triton`` |
| ``bert``             | transformers BERT inference (``BertConfig``), default mode |
| ``llama-train``      | transformers Llama train step: forward + loss + backward + a compiled AdamW step |
| ``bert-dynamic``     | BERT with ``dynamic=True``, called with two batch/sequence shapes |
| ``mlp-autotune``     | a small MLP in ``max-autotune-no-cudagraphs`` (Triton GEMM templates autotuned) |
| ``llama-cudagraphs`` | Llama inference with ``mode="reduce-overhead"`` (CUDA graphs): three calls |
| ``tiny``             | a 2-layer MLP: orchestration checks on a CPU, needs nothing but torch |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Workload:
    build: Callable[[str, dict[str, Any]], tuple[Callable[[Any], torch.Tensor], Any, dict[str, Any]]]
    sizes: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # modules it imports, "a|b" for either (the orchestrator's preflight)
    precompile_ok: bool = True  # False: torch 2.11 cannot package it (README "What torch 2.11 cannot package")
    est_cold_wall_s: float = 60.0  # a cold node's wall time on an H100 (process start to exit): budget planning


def parse_sizes(text: str) -> dict[str, Any]:
    """``"layers=2,hidden=128,dtype=bf16"`` -> ``{"layers": 2, "hidden": 128, "dtype": "bf16"}``."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            try:
                out[key.strip()] = float(value)
            except ValueError:
                out[key.strip()] = value.strip()
    return out


def _dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _no_grad(compiled: Callable[..., Any]) -> Callable[[Any], torch.Tensor]:
    def step(x: Any) -> torch.Tensor:
        with torch.no_grad():
            return compiled(x)

    return step


# --- vision ------------------------------------------------------------------------------------


def _resnet50(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    try:
        import timm

        model, source = timm.create_model("resnet50", pretrained=False), f"timm {timm.__version__}"
    except ImportError:
        import torchvision

        model, source = torchvision.models.resnet50(weights=None), f"torchvision {torchvision.__version__}"
    model = model.to(device).eval()
    x = torch.randn(s["batch"], 3, s["image"], s["image"], device=device)
    return _no_grad(torch.compile(model)), x, {"model": source}


# --- transformers ------------------------------------------------------------------------------


def _gpt2(device: str, s: dict[str, Any], train: bool) -> tuple[Any, Any, dict[str, Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=s["layers"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).to(device)
    ids = torch.randint(0, cfg.vocab_size, (s["batch"], s["seq"]), device=device)
    if train:
        model.train()
        compiled = torch.compile(model)

        def step(ids: Any) -> torch.Tensor:
            loss = compiled(ids, labels=ids).loss
            loss.backward()
            return torch.stack([loss.detach(), model.transformer.wte.weight.grad.norm()])

        return step, ids, {}
    model.eval()
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")

    def infer(ids: Any) -> torch.Tensor:
        with torch.no_grad():
            return compiled(ids).logits

    return infer, ids, {}


def _bert_model(device: str, s: dict[str, Any]) -> tuple[Any, Any]:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        intermediate_size=4 * s["hidden"], max_position_embeddings=max(512, s["seq"]),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertModel(cfg).to(device).eval(), cfg


class BertPooled(torch.nn.Module):
    """BERT's last hidden state at the first token: a tensor output, defined at module level so
    Dynamo's precompile cache can name it (classes in a local scope cannot be packaged)."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids).last_hidden_state[:, 0]


def _bert(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    model, cfg = _bert_model(device, s)
    ids = torch.randint(0, cfg.vocab_size, (s["batch"], s["seq"]), device=device)
    return _no_grad(torch.compile(BertPooled(model))), ids, {}


def _bert_dynamic(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    model, cfg = _bert_model(device, s)
    compiled = torch.compile(BertPooled(model), dynamic=True)
    shapes = [(s["batch"], s["seq"]), (s["batch2"], s["seq2"])]
    inputs = [torch.randint(0, cfg.vocab_size, shape, device=device) for shape in shapes]

    def step(inputs: Any) -> torch.Tensor:  # both shapes before the first result
        with torch.no_grad():
            return torch.cat([compiled(ids) for ids in inputs])

    return step, inputs, {"shapes": shapes}


def _llama_train(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    # The kit's (shared with bench/gpu_multirank.py); imported here, in the node: the
    # orchestrator loads this module for the workloads' specs where the kit is not importable.
    from kcache_testkit.models import CausalLMLoss, llama

    model, cfg = llama(device, s)
    model.train()
    loss_fn = torch.compile(CausalLMLoss(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_step = torch.compile(opt.step) if s["compile_opt"] else opt.step
    ids = torch.randint(0, cfg.vocab_size, (s["batch"], s["seq"]), device=device)
    first = next(model.parameters())

    def step(ids: Any) -> torch.Tensor:
        loss = loss_fn(ids)
        loss.backward()
        grad_norm = first.grad.norm()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return torch.stack([loss.detach(), grad_norm, first.detach().float().sum()])

    return step, ids, {"compiled_optimizer": bool(s["compile_opt"])}


class LogitsAtLast(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits[:, -1]


def _llama_cudagraphs(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    from kcache_testkit.models import llama

    model, cfg = llama(device, s)
    model.eval()
    compiled = torch.compile(LogitsAtLast(model), mode="reduce-overhead")
    ids = torch.randint(0, cfg.vocab_size, (s["batch"], s["seq"]), device=device)

    def step(ids: Any) -> torch.Tensor:
        # CUDA-graph trees warm up on the first call, record on the second, replay on the third:
        # all three come before the job's first result. Outputs live in the graph's memory pool
        # (overwritten by the next replay): clone each one.
        out = None
        with torch.no_grad():
            for _ in range(s["calls"]):
                torch.compiler.cudagraph_mark_step_begin()
                out = compiled(ids).clone()
        assert out is not None
        return out

    return step, ids, {"calls": s["calls"]}


# --- small ones --------------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, layers: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(hidden, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, hidden)) for _ in range(layers)
        )
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(self.norm(x))
        return x


def _mlp_autotune(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    dtype = _dtype(s["dtype"] if device == "cuda" else "fp32")
    model = MLP(s["hidden"], s["ffn"], s["layers"]).to(device=device, dtype=dtype).eval()
    x = torch.randn(s["batch"], s["hidden"], device=device, dtype=dtype)
    return _no_grad(torch.compile(model, mode="max-autotune-no-cudagraphs")), x, {"dtype": str(dtype)}


def _triton_op(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    from bench.gpu_triton_op import TritonOpModel

    model = TritonOpModel().to(device)
    x = torch.randn(64, 1024, device=device)
    return _no_grad(torch.compile(model)), x, {}


def _tiny(device: str, s: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(device)
    x = torch.randn(32, 64, device=device)
    return _no_grad(torch.compile(model)), x, {}


_BERT = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 30522, "batch": 8, "seq": 128}
_LLAMA = {"layers": 4, "hidden": 256, "ffn": 704, "heads": 4, "kv_heads": 2, "vocab": 8192, "batch": 4, "seq": 256}

# est_cold_wall_s: measured cold walls on the H100 (bench/results/gpu/README.md) for the first four,
# guesses from their sizes for the others until a run measures them.
WORKLOADS: dict[str, Workload] = {
    "resnet50": Workload(_resnet50, {"batch": 16, "image": 224}, ("timm|torchvision",), est_cold_wall_s=40),
    "gpt2-train": Workload(lambda d, s: _gpt2(d, s, True), {"layers": 6, "batch": 4, "seq": 512}, ("transformers",), False, 55),
    "gpt2-autotune": Workload(lambda d, s: _gpt2(d, s, False), {"layers": 6, "batch": 4, "seq": 512}, ("transformers",), est_cold_wall_s=150),
    "triton-op": Workload(_triton_op, {}, ("triton",), False, 30),
    "bert": Workload(_bert, dict(_BERT), ("transformers",), est_cold_wall_s=35),
    "llama-train": Workload(_llama_train, {**_LLAMA, "compile_opt": 1}, ("transformers",), est_cold_wall_s=60),
    "bert-dynamic": Workload(_bert_dynamic, {**_BERT, "batch2": 4, "seq2": 96}, ("transformers",), est_cold_wall_s=40),
    "mlp-autotune": Workload(
        _mlp_autotune, {"hidden": 1024, "ffn": 4096, "layers": 2, "batch": 256, "dtype": "bf16"}, est_cold_wall_s=60
    ),
    "llama-cudagraphs": Workload(
        _llama_cudagraphs, {**_LLAMA, "layers": 2, "batch": 8, "seq": 128, "calls": 3}, ("transformers",), est_cold_wall_s=35
    ),
    "tiny": Workload(_tiny, est_cold_wall_s=20),
}


def sizes_for(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The workload's defaults, with the overrides of the parameters it has."""
    defaults = WORKLOADS[name].sizes
    return {**defaults, **{k: v for k, v in overrides.items() if k in defaults}}


def build(name: str, device: str, overrides: dict[str, Any] | None = None) -> tuple[Callable[[Any], torch.Tensor], Any, dict[str, Any]]:
    """Return (step, inputs, info): ``step(inputs)`` compiles on its first call and returns a tensor."""
    if name not in WORKLOADS:
        raise SystemExit(f"unknown workload {name}; known: {', '.join(WORKLOADS)}")
    torch.manual_seed(0)
    sizes = sizes_for(name, overrides or {})
    step, inputs, info = WORKLOADS[name].build(device, sizes)
    return step, inputs, {"sizes": sizes, **info}
