"""Warm-start SFT memory and speed on the Qwen3.5-4B shape under a GPU memory cap.

The same trainer as `rlvr warm-start` (modeling/sft.py's TRL SFTConfig: pre-tokenized rows, PEFT
LoRA, TRL's chunked NLL loss, which never materialises the [tokens, vocab] logits), one row of
N tokens per step, random weights in the real shape (vocab 248,320). Each configuration runs
in its own process, capped with torch.cuda.set_per_process_memory_fraction, so a 24 GiB card
is stood in for on a larger one. Levers, in the order tried: gradient checkpointing, then
activation offloading to host memory.

    python -m bench.sft_memory --tokens 8192 16384 --cap-gib 24 --kernels off auto --json docs/results/sft_memory_h200.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

LEVERS = {"gc": dict(gradient_checkpointing=True), "gc+offload": dict(gradient_checkpointing=True,
                                                                      activation_offload=True)}


def worker(tokens: int, lever: str, cap_gib: float, steps: int, kernels: str) -> dict:
    import tempfile

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback
    from trl import SFTTrainer

    from bench.learner_memory import QWEN35_4B
    from modeling.sft import _sft_args, select_kernels
    from rl.config import RunConfig, WarmStartConfig
    from tests.fixtures.qwen35_checkpoint import tiny_tokenizer

    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total))
    cfg = AutoConfig.for_model("qwen3_5_text", **QWEN35_4B, layer_types=[
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(QWEN35_4B["num_hidden_layers"])])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    ws = WarmStartConfig(max_length=tokens, fast_kernels=kernels, **LEVERS[lever])
    chosen = select_kernels(model, ws, cuda=True)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(0, 248000, (tokens,), generator=g).tolist(),
             "assistant_masks": [0] * (tokens // 4) + [1] * (tokens - tokens // 4)} for _ in range(steps)]
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            marks.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        args = _sft_args(ws, Path(tmp), cuda=True, bf16=True)
        args.max_steps, args.gradient_accumulation_steps = steps, 1
        args.save_strategy, args.disable_tqdm = "no", True
        lora = RunConfig().lora  # the warm-start's adapter: the run's lora section
        peft = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules),
                          task_type="CAUSAL_LM")
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tiny_tokenizer(), peft_config=peft, callbacks=[Clock()])
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            trainer.train()
            status = "ok"
        except torch.OutOfMemoryError:
            status = "OOM"
    step_s = [b - a for a, b in zip([start, *marks[:-1]], marks)]
    steady = step_s[1:] or step_s
    out = {"tokens": tokens, "lever": lever, "cap_gib": cap_gib, "status": status, "kernels": kernels,
           "kernel_reason": chosen["reason"],
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "step_s": step_s}
    if status == "ok":
        out["s_per_1k_tokens"] = sum(steady) / len(steady) / (tokens / 1000)
    return out


def run_one(tokens: int, lever: str, kernels: str, a: argparse.Namespace) -> dict:
    """One configuration in its own process: a cap, an OOM or a hang cannot leak into the next."""
    failed = {"tokens": tokens, "lever": lever, "kernels": kernels, "peak_gib": 0.0, "step_s": []}
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.sft_memory", "--worker", str(tokens), lever, kernels,
                               "--cap-gib", str(a.cap_gib), "--steps", str(a.steps)],
                              capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired as e:
        return failed | {"status": f"timed out after {a.timeout:.0f} s",
                         "stderr_tail": (e.stderr or b"")[-2000:].decode(errors="replace")}
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if found:
        return json.loads(found[-1][7:])
    return failed | {"status": f"crashed (rc {proc.returncode})", "stderr_tail": proc.stderr[-2000:]}


def table(rows: list[dict]) -> str:
    lines = ["| tokens | kernels | levers | status | peak GiB | s / step (steady) | s per 1k tokens |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        steady = r["step_s"][1:] or r["step_s"]
        s = f"{sum(steady) / len(steady):.2f}" if steady and r["status"] == "ok" else "-"
        k = f"{r['s_per_1k_tokens']:.3f}" if "s_per_1k_tokens" in r else "-"
        lines.append(f"| {r['tokens']} | {r.get('kernels', '-')} | {r['lever']} | {r['status']} | {r['peak_gib']:.2f} | {s} | {k} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--cap-gib", type=float, default=24.0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--levers", nargs="+", default=list(LEVERS), help="tried in order until one fits")
    ap.add_argument("--kernels", nargs="+", default=["off"], choices=["auto", "on", "off"],
                    help="warm_start.fast_kernels settings to measure (off: transformers' PyTorch path)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per configuration before it is ended")
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=3, metavar=("TOKENS", "LEVER", "KERNELS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker(int(a.worker[0]), a.worker[1], a.cap_gib, a.steps, a.worker[2])), flush=True)
        return
    rows = []
    for kernels in a.kernels:
        for tokens in a.tokens:
            for lever in a.levers:
                row = run_one(tokens, lever, kernels, a)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["status"] == "ok":
                    break
    print(table(rows))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows, "table": table(rows)}, indent=1))


if __name__ == "__main__":
    main()
