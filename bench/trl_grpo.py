"""Our GRPO loop vs TRL's GRPOTrainer on the same tiny job, alternated in one run: start-up
and steady-state step time.

The job: SmolLM2-135M, LoRA r16 on all projections, the length reward on the loop-closure
prompts, one prompt x 8 completions x at most 64 tokens per step, one thread per process
(ours: engine and learner one each). Each run is a fresh process, as a user starts it:
start-up is launch -> first step begins; steady state is the median step after the first.
Ours is `rlvr train configs/length.yaml` with the matching overrides; TRL's is
GRPOTrainer (HF generate) on the same prompts and reward.

    python bench/trl_grpo.py [--steps 4] [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GROUP, MAX_TOKENS, LR = 8, 64, 2e-3


def ours_overrides(run_dir: Path, steps: int) -> list[str]:
    return [f"trainer.run_dir={run_dir}", f"trainer.steps={steps}", "trainer.batch_size=1",
            f"trainer.group_size={GROUP}", f"trainer.checkpoint_every={steps}", f"rollout.max_tokens={MAX_TOKENS}",
            "rollout.num_cpus=1", "learner.torch_threads=1", "learner.lora_rank=16", "learner.lora_alpha=32",
            f"learner.lr={LR}", "sync.strategy=merged"]


def run_ours(steps: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-ours-")) / "run"
    launch = time.time()
    subprocess.run([sys.executable, "-m", "cli.main", "train", "configs/length.yaml", *ours_overrides(run_dir, steps)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = recs[0]
    first_step = sum(first.get(k, 0.0) for k in ("time_rollout_s", "time_learn_s", "time_sync_s", "time_probe_s"))
    steps_s = [b["time"] - a["time"] for a, b in zip(recs, recs[1:])]
    return {"startup_s": first["time"] - first_step - launch, "step_s": steps_s, "first_step_s": first_step,
            "reward_mean": [r["reward_mean"] for r in recs]}


def run_trl(steps: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench-trl-")) / "times.json"
    launch = time.time()
    subprocess.run([sys.executable, __file__, "--trl-child", str(out), "--steps", str(steps)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    t = json.loads(out.read_text())
    return {"startup_s": t["begin"][0] - launch, "step_s": [e - b for b, e in zip(t["begin"][1:], t["end"][1:])],
            "first_step_s": t["end"][0] - t["begin"][0], "reward_mean": t["reward"]}


def trl_child(out: str, steps: int) -> None:
    """TRL's GRPOTrainer on the same job; writes step begin/end wall times to `out`."""
    import torch
    torch.set_num_threads(1)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl.config import LearnerConfig
    from rl.default_model import resolve_model_path
    from rl.length_reward import LENGTH_PROMPTS

    times: dict[str, list] = {"begin": [], "end": [], "reward": []}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            times["begin"].append(time.time())

        def on_step_end(self, args, state, control, **kw):
            times["end"].append(time.time())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                times["reward"].append(logs["reward"])

    def shorter(completion_ids, **kw):  # rl.length_reward's rule on token ids
        return [0.0 if len(ids) >= MAX_TOKENS else 1.0 - len(ids) / MAX_TOKENS for ids in completion_ids]

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in LENGTH_PROMPTS])
    args = GRPOConfig(output_dir=str(Path(out).parent / "trl"), per_device_train_batch_size=GROUP,
                      num_generations=GROUP, max_completion_length=MAX_TOKENS, max_steps=steps, learning_rate=LR,
                      temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                      bf16=False, gradient_checkpointing=False, dataloader_num_workers=0, seed=0)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LearnerConfig().lora_target_modules,
                      task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=resolve_model_path("default"), reward_funcs=shorter, args=args,
                          train_dataset=data, peft_config=lora, callbacks=[Clock()])
    trainer.train()
    Path(out).write_text(json.dumps(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--trl-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_child:
        trl_child(args.trl_child, args.steps)
        return
    runs: dict[str, list[dict]] = {"ours": [], "trl": []}
    for r in range(args.rounds):
        for name, fn in ((("ours", run_ours), ("trl", run_trl)) if r % 2 == 0 else (("trl", run_trl), ("ours", run_ours))):
            res = fn(args.steps)
            runs[name].append(res)
            print(f"round {r + 1} {name:>4}: start-up {res['startup_s']:.1f}s, steps {[round(s, 1) for s in res['step_s']]}",
                  flush=True)
    summary = {name: {"startup_s": statistics.median(r["startup_s"] for r in rs),
                      "steady_step_s": statistics.median(s for r in rs for s in r["step_s"])}
               for name, rs in runs.items()}
    o, t = summary["ours"], summary["trl"]
    print(f"\n{GROUP} completions x {MAX_TOKENS} tokens, LoRA r16, 1 thread; {args.rounds} alternated rounds x "
          f"{args.steps} steps (load {os.getloadavg()[0]:.1f})")
    print(f"{'':>14} | {'ours':>8} | {'TRL':>8} | {'ours/TRL':>8}")
    for key in ("startup_s", "steady_step_s"):
        print(f"{key:>14} | {o[key]:>8.1f} | {t[key]:>8.1f} | {o[key] / t[key]:>8.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "runs": runs,
                                               "load_avg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
