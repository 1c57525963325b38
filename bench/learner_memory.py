"""Peak memory, step time, tokens/s and MFU of one GRPO step of the project's Learner, per variant and length.

Each variant runs in a fresh process (clean CUDA allocator / clean RSS high-water mark);
lengths run in ascending order and a variant stops at its first out-of-memory. With --baseline,
every row also shows its tokens/s over the baseline variant's at the same length (old vs new
side by side in one run). Variants with fast_kernels="off" run as the learner did before the
fast kernels: flash-linear-attention is made unimportable in their process, so transformers
takes its PyTorch Gated-DeltaNet.

  CPU (SmolLM2-135M):   python -m bench.learner_memory --model default --lengths 512,1024,2048
  GPU (Qwen3.5-4B shape, random weights, capped at 24 GiB):
      python -m bench.learner_memory --model qwen3.5-4b-random --cap-gib 24 --lora-targets all-linear \
          --lengths 8192,16384,32768 --variants old,fast,fast+offload --baseline old --json docs/results/learner_speed_h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    # name: LearnerConfig overrides
    "naive": {"loss_impl": "naive"},
    "chunked": {"loss_impl": "chunked"},
    "chunked+tile": {"loss_impl": "chunked", "mlp_tile_tokens": 4096},
    "chunked+offload": {"loss_impl": "chunked", "activation_offload": True},
    "chunked+offload+tile": {"loss_impl": "chunked", "activation_offload": True, "mlp_tile_tokens": 4096},
    "chunked+offload+tile+seg": {"loss_impl": "chunked", "activation_offload": True, "mlp_tile_tokens": 4096,
                                 "linear_attn_segment_tokens": 4096},
    "chunked512+offload+tile+seg": {"loss_impl": "chunked", "activation_offload": True, "mlp_tile_tokens": 4096,
                                    "linear_attn_segment_tokens": 4096, "logit_chunk_tokens": 512},
    "chunked512+offload+tile": {"loss_impl": "chunked", "activation_offload": True, "mlp_tile_tokens": 4096,
                                "logit_chunk_tokens": 512},
    # the learner before the fast kernels, with the savers that let 32768 tokens fit under 24 GiB
    "old": {"loss_impl": "chunked", "activation_offload": True, "mlp_tile_tokens": 4096,
            "linear_attn_segment_tokens": 4096, "fast_kernels": "off"},
    "old-fastest": {"loss_impl": "chunked", "mlp_tile_tokens": 4096, "fast_kernels": "off"},
    # fla Gated-DeltaNet + causal conv; the segments are a PyTorch-path saver and are left off.
    # fast+offload is the 24 GiB choice: 16k at 12.6 GiB, 32k at 16.8 GiB, ~6k tokens/s on an H200
    # (docs/results/learner_speed_h200.md)
    "fast": {"loss_impl": "chunked", "mlp_tile_tokens": 4096, "fast_kernels": "on"},
    "fast+offload": {"loss_impl": "chunked", "activation_offload": True, "mlp_tile_tokens": 4096, "fast_kernels": "on"},
    "fast-notile": {"loss_impl": "chunked", "fast_kernels": "on"},
}
for _v in VARIANTS.values():  # variants written before the switch existed ran without fla
    _v.setdefault("fast_kernels", "off")

# bf16 dense matmul rate the MFU is taken against: 790 TFLOP/s is what an 8192^3 bf16 product
# reached on this H200 (random data); the datasheet's 989 would give 0.8x these MFUs.
PEAK_TFLOPS = 790.0


def flops_per_token(model, tokens: int, lora_rank: int) -> dict:
    """Estimated FLOPs one trained token costs in a LoRA GRPO step with gradient checkpointing.

    - every frozen linear layer (the LM head too, tied or not): forward, recompute in backward, and the
      input-gradient matmul: 3 x 2 FLOPs per weight (no weight gradient: the base is frozen;
      the chunked loss likewise recomputes the LM-head logits in backward);
    - LoRA adapters: r x (in + out) per linear, forward + recompute + input and weight gradients (4 x 2);
    - causal softmax attention: a token attends to tokens/2 keys on average; QK^T and PV cost
      2 x 2 x (tokens/2) x heads x head_dim forward, x4 for forward, recompute and a 2x backward;
    - chunked Gated-DeltaNet (64-token chunks): per value head about 2 x (2*64*dk + 2*64*dv + 3*dk*dv)
      forward (intra-chunk products, state read, state update), x4 likewise.
    Embedding lookups, norms, activations and the loss's elementwise work are left out.
    """
    import torch

    cfg = model.config
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and "lora_" not in n)
    lora = sum(lora_rank * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and "lora_" not in n and not n.endswith("lm_head"))
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    n_attn = sum(t == "full_attention" for t in types)
    n_lin = sum(t == "linear_attention" for t in types)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = n_attn * 4 * 2 * tokens * cfg.num_attention_heads * head_dim
    gdn = 0
    if n_lin:
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        gdn = n_lin * 4 * cfg.linear_num_value_heads * 2 * (2 * 64 * dk + 2 * 64 * dv + 3 * dk * dv)
    parts = {"linear": 6 * linear, "lora": 8 * lora, "attention": attn, "linear_attention": gdn}
    parts["total"] = sum(parts.values())
    return parts

# Qwen3.5-4B text model (hidden 2560, 32 layers: 3 Gated-DeltaNet per full-attention layer)
QWEN35_4B = dict(
    vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
    num_attention_heads=16, num_key_value_heads=4, head_dim=256, attn_output_gate=True,
    full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_value_head_dim=128,
    tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=65536,
)


def build_model(name: str, device, dtype):
    """(model_path, prebuilt base model or None)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if name == "qwen3.5-4b-random":
        cfg = AutoConfig.for_model("qwen3_5_text", **QWEN35_4B,
                                   layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                                for i in range(QWEN35_4B["num_hidden_layers"])])
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        return "", model
    from modeling.default_model import resolve_model_path
    return resolve_model_path(name), None


def worker(args) -> None:
    if VARIANTS[args.variant]["fast_kernels"] == "off":
        sys.modules["fla"] = None  # transformers then takes its PyTorch Gated-DeltaNet, as before fla
    import torch

    from actors.learner import Learner, pick_device
    from rl.config import LearnerConfig, LoraConfig, ModelConfig
    from rl.types import TrainSample

    device = pick_device()
    if device.type == "cuda" and args.cap_gib:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, device)
    lora = LoraConfig(rank=16, alpha=32, target_modules=args.lora_targets.split(","))
    fields = dict(logit_chunk_tokens=args.logit_chunk, micro_batch_tokens=max(args.lengths_list),
                  torch_threads=args.threads)
    lcfg = LearnerConfig(**{**fields, **VARIANTS[args.variant]})
    mcfg = ModelConfig()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    path, model = build_model(args.model, device, dtype)
    learner = Learner(path, lcfg, mcfg, seed=0, lora=lora, base_model=model)
    static = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None
    vocab = learner.lm_head.weight.shape[0]
    base = learner.model.get_base_model()
    emit({"event": "ready", "variant": args.variant, "build_s": time.perf_counter() - t0,
          "trainable_params": learner.num_trainable_params(), "static_gib": static,
          "fast_kernels": learner.fast_kernels, "peak_tflops": args.peak_tflops,
          "flops_per_token": {n: flops_per_token(base, n, lora.rank) for n in args.lengths_list}})
    rng = random.Random(0)

    def sample(n: int) -> TrainSample:
        prompt = n // 10
        ids = [rng.randrange(vocab) for _ in range(n)]
        mask = [0] * prompt + [1] * (n - prompt)
        lps = [0.0] * prompt + [-rng.uniform(5, 12) for _ in range(n - prompt)]
        return TrainSample(ids, mask, lps, advantage=1.0)

    learner.train_step([sample(min(args.lengths_list))])  # warm-up: kernels, allocator, optimizer state
    for n in args.lengths_list:
        row = {"variant": args.variant, "tokens": n}
        try:
            m = learner.train_step([sample(n)])
            fpt = flops_per_token(base, n, lora.rank)["total"]
            row.update(status="ok", peak_gib=m["peak_mem_gib"], step_s=m["seconds"],
                       tokens_per_s=n / m["seconds"], loss=m["loss"], grad_norm=m["grad_norm"],
                       mfu=n * fpt / m["seconds"] / (args.peak_tflops * 1e12))
            if device.type == "cuda":
                row["reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
        except torch.OutOfMemoryError:
            row.update(status="oom", peak_gib=torch.cuda.max_memory_allocated(device) / 2**30
                       if device.type == "cuda" else None)
            emit(row)
            break
        emit(row)


def emit(obj: dict) -> None:
    print("@@" + json.dumps(obj), flush=True)


def speed_table(rows: list[dict], baseline: str | None, peak_tflops: float) -> str:
    """One line per (length, variant): peak memory, step time, tokens/s, MFU and the ratio to the baseline."""
    cell = {(r["variant"], r["tokens"]): r for r in rows}
    lines = [f"| tokens | variant | peak GiB | step s | tokens/s | MFU (of {peak_tflops:g} TFLOP/s) |"
             + (f" tokens/s vs {baseline} |" if baseline else ""),
             "|---|---|---|---|---|---|" + ("---|" if baseline else "")]
    for n in sorted({r["tokens"] for r in rows}):
        for v in dict.fromkeys(r["variant"] for r in rows):
            r = cell.get((v, n))
            if r is None:
                continue
            if r["status"] != "ok":
                peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") else "—"
                lines.append(f"| {n} | {v} | OOM (peak {peak}) | — | — | — |" + (" — |" if baseline else ""))
                continue
            line = (f"| {n} | {v} | {r['peak_gib']:.1f} | {r['step_s']:.2f} | {r['tokens_per_s']:,.0f} | "
                    f"{100 * r.get('mfu', 0):.1f}% |")
            if baseline:
                b = cell.get((baseline, n))
                line += (f" {r['tokens_per_s'] / b['tokens_per_s']:.2f}x |" if b and b["status"] == "ok" else " — |")
            lines.append(line)
    return "\n".join(lines)


def table(rows: list[dict], cap: float | None) -> str:
    lengths = sorted({r["tokens"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    cell = {(r["variant"], r["tokens"]): r for r in rows}
    head = "| tokens | " + " | ".join(variants) + " |"
    lines = [head, "|" + "---|" * (len(variants) + 1)]
    for n in lengths:
        parts = []
        for v in variants:
            r = cell.get((v, n))
            if r is None:
                parts.append("—")
            elif r["status"] == "oom":
                parts.append(f"OOM (peak {r['peak_gib']:.1f} GiB)" if r.get("peak_gib") else "OOM")
            else:
                parts.append(f"{r['peak_gib']:.1f} GiB, {r['step_s']:.1f} s")
        lines.append(f"| {n} | " + " | ".join(parts) + " |")
    if cap:
        ok = [r for r in rows if r["tokens"] == 8192 and r["status"] == "ok"]
        if ok:
            best = min(ok, key=lambda r: r["peak_gib"])
            lines.append(f"\nheadroom at 8192 tokens under the {cap:g} GiB cap: "
                         f"{cap - best['peak_gib']:.1f} GiB ({best['variant']}, peak {best['peak_gib']:.1f} GiB)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default' (SmolLM2-135M), an HF folder, or qwen3.5-4b-random")
    ap.add_argument("--lengths", default="512,1024,2048")
    ap.add_argument("--variants", default="naive,chunked")
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                    help="comma list, or all-linear")
    ap.add_argument("--logit-chunk", type=int, default=1024)
    ap.add_argument("--cap-gib", type=float, default=0.0, help="GPU: cap this process's CUDA memory")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--baseline", default=None, help="variant whose tokens/s the others are compared with")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS, help="bf16 rate the MFU is taken against")
    ap.add_argument("--json", default=None, help="save rows + table here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lengths_list = [int(x) for x in args.lengths.split(",")]
    if args.worker:
        worker(args)
        return
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    rows, meta = [], []
    for v in args.variants.split(","):
        cmd = [sys.executable, "-m", "bench.learner_memory", "--worker", "--variant", v] + [
            a for a in sys.argv[1:] if a not in ("--worker",)]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        got = [json.loads(line[2:]) for line in proc.stdout.splitlines() if line.startswith("@@")]
        for g in got:
            (meta if g.get("event") == "ready" else rows).append(g)
            print(json.dumps(g), flush=True)
        if proc.returncode != 0:
            print(f"variant {v} exited {proc.returncode}:\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
            rows.append({"variant": v, "tokens": -1, "status": f"error rc={proc.returncode}"})
    rows = [r for r in rows if r["tokens"] > 0] + [r for r in rows if r["tokens"] <= 0]
    ok_rows = [r for r in rows if r["tokens"] > 0]
    text = table(ok_rows, args.cap_gib or None) + "\n\n" + speed_table(ok_rows, args.baseline, args.peak_tflops)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "worker"},
                                               "builds": meta, "rows": rows, "table": text}, indent=1))


if __name__ == "__main__":
    main()
