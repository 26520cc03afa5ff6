"""One vLLM engine, the way a serving process starts: build ``LLM``, then generate greedily from
fixed prompt token ids. Run as a fresh interpreter in the vLLM environment by
:func:`kcache_testkit.vllm_nodes.run_engine` (tests/test_vllm.py, bench/vllm_cpu.py), with
kcache only through ``KCACHE_URL``.

argv: the model dir. ``KCACHE_TESTKIT_VLLM_MAX_MODEL_LEN`` (default 128) changes a field vLLM
hashes into its compile key (the explain test). Prints ``RESULT {json}``: the token ids, the engine's init time, the time to
the first token of a one-token request, and vLLM's compile counters where the engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
"""

from __future__ import annotations

import json
import os
import sys
import time

PROMPTS = [[1, 17, 254, 33, 800, 5, 91], [3, 3, 500, 12, 640, 7, 7, 99, 1000]]
MAX_TOKENS = 12


def main(model_dir: str) -> None:
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, skip_tokenizer_init=True, max_model_len=int(os.environ.get("KCACHE_TESTKIT_VLLM_MAX_MODEL_LEN", "128")), max_num_seqs=4,
              max_num_batched_tokens=128, dtype="float32", seed=0)
    init_s = time.monotonic() - t0
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    t1 = time.monotonic()
    llm.generate(prompts[:1], SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False)
    first_token_s = time.monotonic() - t1
    outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, detokenize=False), use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    from vllm.compilation.counter import compilation_counter

    counters = {k: v for k, v in vars(compilation_counter).items() if k.startswith("num_aot")}
    print("RESULT " + json.dumps({"tokens": tokens, "init_s": init_s, "first_token_s": first_token_s, "counters": counters}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
