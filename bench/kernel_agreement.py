"""Agreement of the learner's fast Gated-DeltaNet path with the PyTorch reference on the same
weights, and of packed rows with unpacked ones (random Qwen3.5-4B shape, bf16, one GPU).

- kernel check: enable_fast_kernels' own start-up numbers (relative errors, forward and gradients);
- log-probs of one sequence, reference vs fast: max / mean |delta|;
- LoRA gradients of one GRPO loss, reference vs fast: relative error;
- packed vs unpacked (fast path): log-probs of three samples in one row against each alone.

  python -m bench.kernel_agreement --tokens 4096 --json docs/results/kernel_agreement_h200.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--packed", default="1500,2600,700", help="sample lengths packed into one row")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from actors.learner import Learner
    from bench.learner_memory import build_model
    from modeling.fast_kernels import enable_fast_kernels
    from modeling.packing import pack, packed_rows
    from rl.config import LearnerConfig, LoraConfig, ModelConfig
    from rl.types import TrainSample

    device = torch.device("cuda")
    _, model = build_model("qwen3.5-4b-random", device, torch.bfloat16)
    cfg = LearnerConfig(fast_kernels="off", mlp_tile_tokens=4096)
    lora = LoraConfig(rank=16, alpha=32, target_modules=["all-linear"])
    ln = Learner("", cfg, ModelConfig(), seed=0, lora=lora, base_model=model)
    torch.manual_seed(1)
    for n, p in ln.model.named_parameters():  # non-zero LoRA B, so the adapters take part
        if "lora_B" in n:
            p.data.normal_(0, 0.02)
    vocab = ln.lm_head.weight.shape[0]
    ids = torch.randint(0, vocab, (args.tokens,)).tolist()
    out: dict = {"tokens": args.tokens}

    def logprobs() -> torch.Tensor:
        return torch.tensor(ln.sequence_logprobs(ids)[1:])

    def lora_grads() -> dict:
        ln.model.zero_grad(set_to_none=True)
        x = torch.tensor([ids], device=device)
        hidden = ln._hidden(x, None)[0, :-1]
        logp = ln._target_logprobs(hidden, x[0, 1:])
        (-logp.mean()).backward()
        return {n: p.grad.float().clone() for n, p in ln.model.named_parameters() if p.requires_grad}

    t0 = time.perf_counter()
    out["reference_setup"] = enable_fast_kernels(ln.decoder, device, fast=False)
    ref_lp, ref_g = logprobs(), lora_grads()
    out["reference_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out["fast_setup"] = enable_fast_kernels(ln.decoder, device, required=True)
    fast_lp, fast_g = logprobs(), lora_grads()
    out["fast_s"] = time.perf_counter() - t0
    d = (fast_lp - ref_lp).abs()
    out["logprob_abs_delta"] = {"max": float(d.max()), "mean": float(d.mean())}
    num = sum(float((fast_g[k] - ref_g[k]).norm() ** 2) for k in ref_g) ** 0.5
    den = sum(float(ref_g[k].norm() ** 2) for k in ref_g) ** 0.5
    out["lora_grad_rel_err"] = num / den
    per = [float((fast_g[k] - ref_g[k]).norm() / ref_g[k].norm().clamp_min(1e-20)) for k in ref_g]
    out["lora_grad_rel_err_worst_tensor"] = max(per)

    lengths = [int(x) for x in args.packed.split(",")]
    samples = [TrainSample(torch.randint(0, vocab, (n,)).tolist(), [0] + [1] * (n - 1), [0.0] * n, 1.0)
               for n in lengths]
    alone = [torch.tensor(ln.sequence_logprobs(s.token_ids)[1:]) for s in samples]
    row = {k: v.to(device) for k, v in pack(samples).items()}
    cu = row["cu_seqlens"].tolist()
    ln.model.eval()
    with torch.no_grad(), packed_rows(row["cu_seqlens"]):
        hidden = ln._hidden(row["ids"], None, row["positions"])[0, :-1]
        lp = ln._target_logprobs(hidden, row["ids"][0, 1:]).cpu()
    ln.model.train()
    d = torch.cat([(lp[s:e - 1] - a).abs() for s, e, a in zip(cu[:-1], cu[1:], alone)])
    out["packed_vs_unpacked_abs_delta"] = {"lengths": lengths, "max": float(d.max()), "mean": float(d.mean())}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
