"""Small language models for jobs that train under ``torch.compile`` (benchmarks and tests).

* ``llama``: transformers' ``LlamaForCausalLM`` built from a config (random weights, nothing
  downloaded); needs transformers. ``bench/gpu_workloads.py`` and ``ddp_job.py`` build it here.
* ``mlp-lm``: an embedding, residual MLP blocks and a head, in torch alone: the same kind of
  train step where transformers is not installed (CI, a bare CPU machine), and cheap to compile.

Both are called as ``model(input_ids=ids).logits``; :class:`CausalLMLoss` turns either into a
next-token loss computed inside the compiled graph. Sizes are a dict (``SIZES[name]`` the
defaults); the caller seeds torch first.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

SIZES: dict[str, dict[str, int]] = {
    "llama": {"layers": 2, "hidden": 256, "ffn": 704, "heads": 4, "kv_heads": 2, "vocab": 8192, "batch": 4, "seq": 256},
    "mlp-lm": {"layers": 1, "hidden": 32, "ffn": 64, "vocab": 128, "batch": 4, "seq": 16},
}


def llama(device: str | torch.device, s: dict[str, Any]) -> tuple[torch.nn.Module, Any]:
    """``(LlamaForCausalLM, its config)`` on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], max_position_embeddings=max(512, s["seq"]),
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).to(device), cfg


class LMOutput(NamedTuple):
    logits: torch.Tensor


class MlpLM(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int, ffn: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, hidden))
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> LMOutput:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = x + block(x)
        return LMOutput(self.head(x))


def mlp_lm(device: str | torch.device, s: dict[str, Any]) -> torch.nn.Module:
    return MlpLM(s["vocab"], s["hidden"], s["ffn"], s["layers"]).to(device)


def build(name: str, device: str | torch.device, sizes: dict[str, Any]) -> tuple[torch.nn.Module, int]:
    """``(model, vocab size)`` of ``name`` with ``sizes`` over its defaults."""
    s = {**SIZES[name], **sizes}
    if name == "llama":
        return llama(device, s)[0], s["vocab"]
    return mlp_lm(device, s), s["vocab"]


class CausalLMLoss(torch.nn.Module):
    """Next-token cross entropy computed in the compiled graph (not transformers'
    ``loss_function``: a code object behind a property, which torch 2.11's precompile cannot name)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
