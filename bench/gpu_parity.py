"""Served vs learner log-probs on the same Qwen3.5 weights, prefill and decode, on a GPU.

vLLM serves the Gated-DeltaNet layers with its Triton kernels (chunked prefill, recurrent
decode); the learner runs transformers' model with flash-linear-attention or its PyTorch
fallback. The parity probe compares them after every sync, so its threshold has to sit above
the gap that the kernels alone leave: this measures that gap per token, over a few hundred
sampled tokens, for decode (the sampled token's log-prob as generated) and prefill (the same
sequence scored as a prompt), each against the learner.

    python -m bench.gpu_parity --model /tmp/qwen35-4b --tokens 48 --json docs/results/gpu-parity.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _stats(diffs: list[float]) -> dict:
    return {"n": len(diffs), "mean": statistics.fmean(diffs), "max": max(diffs),
            "p99": sorted(diffs)[int(0.99 * (len(diffs) - 1))]}


def measure(worker, learner, prompts: list[list[int]], max_tokens: int) -> dict:
    """Per-token |Δ log-prob| between the engine (decode, prefill) and the learner, on sampled text."""
    from actors.engine import collect_completion

    params = worker.policy.sampling_params(max_tokens, ignore_eos=True)
    streams = [worker.policy.submit(list(p), params)[1] for p in prompts]
    decode, prefill, prompt_prefill, decode_prefill = [], [], [], []
    for prompt, stream in zip(prompts, streams):
        c = collect_completion(prompt, stream)
        seq = list(prompt) + c.token_ids
        served = worker.prompt_logprobs(seq)
        learned = learner.sequence_logprobs(seq)
        n = len(prompt)
        prompt_prefill += [abs(served[j] - learned[j]) for j in range(1, n)]
        for i, lp in enumerate(c.logprobs):
            decode.append(abs(lp - learned[n + i]))
            prefill.append(abs(served[n + i] - learned[n + i]))
            decode_prefill.append(abs(lp - served[n + i]))
    return {"decode_vs_learner": _stats(decode), "prefill_vs_learner": _stats(prefill),
            "prompt_prefill_vs_learner": _stats(prompt_prefill), "decode_vs_prefill": _stats(decode_prefill)}


def prompts_for(tokenizer) -> list[list[int]]:
    from rl.length_reward import LENGTH_PROMPTS
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"] for p in LENGTH_PROMPTS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32, help="sampled tokens per prompt (12 prompts)")
    ap.add_argument("--kernels", nargs="+", default=["auto", "off"], help="learner.fast_kernels settings to compare")
    ap.add_argument("--kv-gib", type=float, default=2.0)
    ap.add_argument("--json")
    a = ap.parse_args()

    from actors.learner import Learner
    from actors.rollout_worker import RolloutWorker
    from rl.config import LearnerConfig, ModelConfig, RolloutConfig

    model = ModelConfig(dtype="bfloat16")
    t0 = time.perf_counter()
    worker = RolloutWorker(a.model, RolloutConfig(num_gpus=1, kv_cache_memory_gib=a.kv_gib, gpu_memory_utilization=0.3,
                                                  max_model_len=2048, max_tokens=a.tokens, sleep_level=0),
                           model, enable_lora=False)
    out = {"model": a.model, "engine_start_s": time.perf_counter() - t0, "runs": {}}
    prompts = prompts_for(worker.tokenizer)
    for kernels in a.kernels:
        learner = Learner(a.model, LearnerConfig(num_gpus=1, fast_kernels=kernels), model, seed=0)
        res = measure(worker, learner, prompts, a.tokens)
        res["learner_kernels"] = learner.fast_kernels.get("reason") if not learner.fast_kernels.get("fast") else "fla"
        out["runs"][kernels] = res
        print(kernels, json.dumps(res), flush=True)
        del learner
        import torch
        torch.cuda.empty_cache()
    worker.shutdown()
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
