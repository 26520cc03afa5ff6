"""Real vLLM engines on user-like nodes, for tests/test_vllm.py and bench/vllm_cpu.py.

A node (:class:`kcache_testkit.nodes.Node`) has its own ``HOME``, ``TMPDIR`` and
``VLLM_CACHE_ROOT``; the model dir is shared, at one path, as a model baked into a serving image
is (vLLM hashes the model's path into its compile key). The engine runs vLLM's real compile path
on the CPU through the test-support plugin ``kcache_testkit/vllm_plugin`` (installed into the
vLLM environment by scripts/vllm_env.sh).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache_testkit.nodes import Node

JOB = Path(__file__).with_name("vllm_job.py")
REPO = Path(__file__).resolve().parent.parent
# vLLM's own log lines that tell how the engine got its compiled model.
LOADED = "Directly load AOT compilation from path"
SAVED = "saved AOT compiled function to"
LOAD_FAILED = "Compiling model again due to a load failure"


def vllm_missing() -> str | None:
    """Why vLLM cannot run in this interpreter, or None if it can."""
    try:
        from importlib.metadata import version

        version("vllm-cpu")
        import vllm  # noqa: F401
    except Exception as exc:  # not installed, or a broken install (CUDA-built torchvision, ...)
        return f"vLLM is not installed in this interpreter ({type(exc).__name__}: {str(exc)[:120]}); " \
               "run the vLLM tests with `scripts/vllm_env.sh run` (builds ~/.cache/kcache/vllm on first use)"
    return None


def make_model(path: Path) -> Path:
    """A tiny random-weight Llama (2 layers, hidden 256, vocab 1024), the same bytes every time."""
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1024, max_position_embeddings=256, torch_dtype="float32")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@dataclass
class EngineRun:
    tokens: list[list[int]]
    init_s: float
    first_token_s: float
    counters: dict[str, int]
    log: str  # the engine's stdout and stderr: vLLM's and kcache's log lines
    stats: dict[str, Any] = field(default_factory=dict)  # kcache's stats document, if written

    def layer(self, name: str) -> dict[str, Any]:
        layers: dict[str, Any] = self.stats.get("layers", {})
        return dict(layers.get(name) or {})

    def lines(self, needle: str) -> list[str]:
        return [ln for ln in self.log.splitlines() if needle in ln]

    @property
    def compile_s(self) -> float | None:
        """vLLM's own figure for the compile (or the AOT load) of the engine's start: the
        "(compilation: N s)" of its "init engine ... took" line."""
        found = re.search(r"init engine .* took [0-9.]+ s \(compilation: ([0-9.]+) s\)", self.log)
        return float(found.group(1)) if found else None


def node_env(node: Node, **settings: str) -> dict[str, str]:
    """The node's environment for an engine: its own vLLM cache root, one small CPU KV cache,
    no telemetry, the test plugin on, ``settings`` on top."""
    env = {k: v for k, v in node.env().items() if not k.startswith("VLLM_")}  # none of the developer's
    env.update(VLLM_CACHE_ROOT=str(node.root / "vllm-cache"), VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", KCACHE_TESTKIT_VLLM_CPU_COMPILE="1")
    env.update(settings)
    return env


def run_engine(node: Node, model: Path, timeout: float = 900, expect_failure: bool = False, **settings: str) -> EngineRun:
    """:mod:`kcache_testkit.vllm_job` as a fresh interpreter on ``node``; kcache stats written
    under the node when ``KCACHE_URL`` is given."""
    run_dir = node.root / f"run-{len(list(node.root.glob('run-*')))}"
    run_dir.mkdir(parents=True)
    stats = run_dir / "stats"
    env = node_env(node, **settings)
    if "KCACHE_URL" in settings:
        stats.mkdir()
        env["KCACHE_STATS_FILE"] = str(stats) + os.sep  # a file per process: the engine core may be a child
    proc = subprocess.run([sys.executable, str(JOB), str(model)], env=env, cwd=node.root,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    (run_dir / "engine.log").write_text(proc.stdout)
    result_line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if expect_failure:
        if proc.returncode == 0:
            raise AssertionError(f"the engine on {node.root} was expected to fail:\n{proc.stdout[-4000:]}")
        return EngineRun([], 0.0, 0.0, {}, proc.stdout, _stats(stats))
    if proc.returncode != 0 or result_line is None:
        raise AssertionError(f"engine failed on {node.root} (rc {proc.returncode}):\n{proc.stdout[-6000:]}")
    result = json.loads(result_line[len("RESULT "):])
    return EngineRun(result["tokens"], result["init_s"], result["first_token_s"], result["counters"], proc.stdout, _stats(stats))


def _stats(path: Path) -> dict[str, Any]:
    if not path.is_dir() or not any(path.glob("*.json")):
        return {}
    from kcache.store.counters import load_stats

    return load_stats(path).model_dump(mode="json")
