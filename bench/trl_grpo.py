"""Our GRPO loop vs TRL's GRPOTrainer on the same tiny job, alternated in one run: start-up
and steady-state step time.

The job: SmolLM2-135M, LoRA r16 on all projections, no gradient checkpointing, the length
reward on the loop-closure prompts, one prompt x 8 completions x at most 64 tokens per step,
one thread per process (ours: engine and learner one each). Each run is a fresh process, as
a user starts it: start-up is launch -> first step begins (ours: the first rollout request, as
the run's start-up line states it); a step is the wall time from one
step's end to the next one's (both sides alike); steady state is the median step after the
first. Sides:
  ours        `rlvr train configs/length.yaml` with the matching overrides (synchronous)
  ours-ahead  the same with trainer.rollout_ahead=true: the engine rolls out step k+1 while
              the learner trains step k, so the step uses both cores
  trl         GRPOTrainer (HF generate) on the same prompts and reward, one thread, fp32
  trl-2t      the same with two threads: the two cores ours-ahead uses
  ours-bf16   ours-ahead with bf16 matmuls on both sides of the loop: learner.cpu_bf16 (autocast,
              fp32 weights) and bf16 serving (parity threshold 0.1, truncated IS weights, cap 2)
  trl-bf16    trl with bf16=True, TRL's own default (autocast on CPU)
  ours-prefix, ours-bf16-prefix
              ours-ahead / ours-bf16 with learner.layout=shared_prefix: the group's prompt is
              computed once in the update, each completion attending to it and itself
Each step's mean completion length is kept too: the reward shortens completions, and a side
whose completions shrink faster does less work per step.

    python -m bench.trl_grpo [--steps 4] [--rounds 2] [--sides ours,ours-ahead,trl,trl-2t,...] [--json out.json]

GPU side (`--gpu`, bench/gpu_grpo.py): ours vs TRL with vLLM colocated on one CUDA card standing in
for a 24 GiB one, at equal work (every completion exactly --gen-tokens long); sides ours-gpu,
ours-gpu-long, ours-gpu-recipe, trl-gpu (eager), trl-gpu-graphs. `--build-qwen2 OUT` writes its ~3B
Qwen2-shaped random checkpoint with the default model's tokenizer.

    python -m bench.trl_grpo --gpu --model /tmp/qwen2-3b --steps 4 --sides ours-gpu,trl-gpu,trl-gpu-graphs,ours-gpu \
        --deadline-s 400 --json out.json
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

from bench.ours_runs import ours_result

ROOT = Path(__file__).resolve().parents[1]

GROUP, MAX_TOKENS, LR = 8, 64, 2e-3


def ours_overrides(run_dir: Path, steps: int) -> list[str]:
    return [f"trainer.run_dir={run_dir}", f"trainer.steps={steps}", "trainer.batch_size=1",
            f"trainer.group_size={GROUP}", f"trainer.checkpoint_every={steps}", f"rollout.max_tokens={MAX_TOKENS}",
            "rollout.num_cpus=1", "learner.torch_threads=1", "lora.rank=16", "lora.alpha=32",
            f"learner.lr={LR}", "learner.gradient_checkpointing=false", "sync.strategy=merged_on_engine"]


def run_ours(steps: int, extra: tuple[str, ...] = ()) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-ours-")) / "run"
    launch = time.time()
    out = subprocess.run([sys.executable, "-m", "cli.main", "train", "configs/length.yaml",
                          *ours_overrides(run_dir, steps), *extra], cwd=ROOT, check=True, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return ours_result(run_dir, out.stdout, launch)


BF16 = ("trainer.rollout_ahead=true", "learner.cpu_bf16=true", "rollout.dtype=bfloat16", "sync.parity_threshold=0.1",
        "learner.tis_cap=2.0")
PREFIX = "learner.layout=shared_prefix"


def run_trl(steps: int, threads: int = 1, bf16: bool = False) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench-trl-")) / "times.json"
    launch = time.time()
    subprocess.run([sys.executable, "-m", "bench.trl_grpo", "--trl-child", str(out), "--steps", str(steps),
                    "--threads", str(threads), *(["--bf16"] if bf16 else [])],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)})
    t = json.loads(out.read_text())
    return {"startup_s": t["begin"][0] - launch, "step_s": [b - a for a, b in zip(t["end"], t["end"][1:])],
            "first_step_s": t["end"][0] - t["begin"][0], "reward_mean": t["reward"],
            "completion_tokens_mean": t["length"],
            "phases": [{"generate_s": round(g, 2), "step_s": round(e - b, 2)}
                       for g, b, e in zip(t["generate"], t["begin"], t["end"])]}


SIDES = {"ours": lambda steps: run_ours(steps), "ours-ahead": lambda steps: run_ours(steps, ("trainer.rollout_ahead=true",)),
         "trl": lambda steps: run_trl(steps, 1), "trl-2t": lambda steps: run_trl(steps, 2),
         "ours-bf16": lambda steps: run_ours(steps, BF16), "trl-bf16": lambda steps: run_trl(steps, 1, bf16=True),
         "ours-prefix": lambda steps: run_ours(steps, ("trainer.rollout_ahead=true", PREFIX)),
         "ours-bf16-prefix": lambda steps: run_ours(steps, (*BF16, PREFIX))}


def _clock(times: dict[str, list], synchronize=None):
    """A TRL callback that keeps each step's begin/end wall time (after `synchronize`, on GPU)
    and its logged reward and completion length in `times`."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            times["begin"].append(time.time())

        def on_step_end(self, args, state, control, **kw):
            if synchronize is not None:
                synchronize()
            times["end"].append(time.time())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                times["reward"].append(logs["reward"])
                times["length"].append(logs.get("completions/mean_length"))

    return Clock()


def trl_child(out: str, steps: int, threads: int, bf16: bool) -> None:
    """TRL's GRPOTrainer on the same job; writes step begin/end wall times (and the time each
    step spent generating) to `out`."""
    import torch
    torch.set_num_threads(threads)
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from modeling.default_model import resolve_model_path
    from rl.config import RunConfig
    from rl.length_reward import LENGTH_PROMPTS

    times: dict[str, list] = {"begin": [], "end": [], "reward": [], "length": [], "generate": []}

    def shorter(completion_ids, **kw):  # rl.length_reward's rule on token ids
        return [0.0 if len(ids) >= MAX_TOKENS else 1.0 - len(ids) / MAX_TOKENS for ids in completion_ids]

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in LENGTH_PROMPTS])
    args = GRPOConfig(output_dir=str(Path(out).parent / "trl"), per_device_train_batch_size=GROUP,
                      num_generations=GROUP, max_completion_length=MAX_TOKENS, max_steps=steps, learning_rate=LR,
                      temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                      bf16=bf16, gradient_checkpointing=False, dataloader_num_workers=0, seed=0)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=RunConfig().lora.target_modules,
                      task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=resolve_model_path("default"), reward_funcs=shorter, args=args,
                          train_dataset=data, peft_config=lora, callbacks=[_clock(times)])
    generate = trainer._generate_and_score_completions  # its rollout phase, timed from outside

    def timed_generate(*a, **kw):
        t0 = time.time()
        try:
            return generate(*a, **kw)
        finally:
            times["generate"].append(time.time() - t0)

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    Path(out).write_text(json.dumps(times))


# ---- the GPU side (bench/gpu_grpo.py) ---------------------------------------------------------
def build_qwen2(out: str, tokenizer: str, end_token_p: float = 0.001) -> dict:
    """A random ~3B Qwen2-shaped checkpoint (Qwen2.5-3B's sizes) with the given tokenizer, its end
    token raised so completion lengths vary (tests.fixtures.qwen35_checkpoint.raise_end_token)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from tests.fixtures.qwen35_checkpoint import raise_end_token

    tok = AutoTokenizer.from_pretrained(tokenizer)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen2Config(vocab_size=-(-len(tok) // 64) * 64, hidden_size=2048, intermediate_size=11008,
                      num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=eos)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    scale = raise_end_token(model, tok, end_token_p)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=eos).save_pretrained(out)
    info = {"shape": "qwen2-3b", "params": sum(p.numel() for p in model.parameters()), "end_token_scale": scale,
            "tokenizer": tokenizer}
    Path(out, "random_checkpoint.json").write_text(json.dumps(info, indent=1))
    return info


def main() -> None:
    from bench import gpu_grpo

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="CPU sides: alternated rounds (on --gpu, list a side twice)")
    ap.add_argument("--sides", help=f"comma-separated; CPU: of {', '.join(SIDES)} (default ours,ours-ahead,trl,trl-2t); "
                    f"--gpu: of {', '.join(gpu_grpo.SIDES)}, in order (default ours-gpu,trl-gpu,trl-gpu-graphs)")
    ap.add_argument("--json")
    ap.add_argument("--trl-child", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gpu", action="store_true", help="the GPU sides (bench/gpu_grpo.py)")
    gpu_grpo.add_gpu_args(ap)
    ap.add_argument("--build-qwen2", metavar="OUT", help="write the random ~3B Qwen2 checkpoint and exit")
    ap.add_argument("--tokenizer", help="--build-qwen2: tokenizer folder (default: the default model's)")
    args = ap.parse_args()
    if args.build_qwen2:
        if not args.tokenizer:
            from modeling.default_model import resolve_model_path
            args.tokenizer = resolve_model_path("default")
        print(json.dumps(build_qwen2(args.build_qwen2, args.tokenizer)))
        return
    if args.trl_gpu_child:
        gpu_grpo.trl_gpu_child(args.trl_gpu_child, gpu_grpo.Job(**json.loads(args.job)), args.eager)
        return
    if args.gpu:
        if not args.model:
            ap.error("--gpu needs --model")
        if not Path(args.model, "config.json").is_file():
            ap.error(f"--model {args.model}: no config.json there (bench/gpu_step.sh prep writes the checkpoints)")
        if args.steps < 2:
            ap.error("--steps must be >= 2 on --gpu (a steady step needs one before it)")
        args.sides = args.sides or "ours-gpu,trl-gpu,trl-gpu-graphs"
        gpu_grpo.gpu_main(args)
        return
    args.sides = args.sides or "ours,ours-ahead,trl,trl-2t"
    if args.trl_child:
        trl_child(args.trl_child, args.steps, args.threads, args.bf16)
        return
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown or args.steps < 3:
        ap.error(f"unknown side(s) {unknown}" if unknown else "--steps must be >= 3 (steady state needs two steps "
                 "after the first)")
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in (sides if r % 2 == 0 else sides[::-1]):
            res = SIDES[name](args.steps)
            runs[name].append(res)
            print(f"round {r + 1} {name:>16}: start-up {res['startup_s']:.1f}s, steps {[round(s, 1) for s in res['step_s']]}, "
                  f"completion tokens {[round(x or 0, 1) for x in res['completion_tokens_mean']]}", flush=True)
    summary = {name: {"startup_s": statistics.median(r["startup_s"] for r in rs),
                      "steady_step_s": statistics.median(s for r in rs for s in r["step_s"]),
                      "completion_tokens_mean": statistics.fmean(x for r in rs for x in r["completion_tokens_mean"][1:]
                                                                 if x is not None)}
               for name, rs in runs.items()}
    base = summary.get("trl") or summary[sides[-1]]
    print(f"\n{GROUP} completions x {MAX_TOKENS} tokens, LoRA r16; {args.rounds} alternated rounds x "
          f"{args.steps} steps (load {os.getloadavg()[0]:.1f}); ratios against trl (1 thread)")
    bf16 = summary.get("trl-bf16")  # the matched-precision baseline for the bf16 sides
    print(f"{'side':>16} | {'start-up s':>10} | {'ratio':>5} | {'step s':>6} | {'ratio':>5} | "
          f"{'vs trl-bf16' if bf16 else '':>11} | {'tokens/completion':>17}")
    for name, m in summary.items():
        vs_bf16 = f"{m['steady_step_s'] / bf16['steady_step_s']:>11.2f}" if bf16 else " " * 11
        print(f"{name:>16} | {m['startup_s']:>10.1f} | {m['startup_s'] / base['startup_s']:>5.2f} | "
              f"{m['steady_step_s']:>6.1f} | {m['steady_step_s'] / base['steady_step_s']:>5.2f} | {vs_bf16} | "
              f"{m['completion_tokens_mean']:>17.1f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "runs": runs,
                                               "load_avg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
