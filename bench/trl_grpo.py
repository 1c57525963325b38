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

GPU side (`--gpu`): the same comparison on one CUDA card standing in for a 24 GiB one, with vLLM
colocated on both sides: a random checkpoint (`--build-qwen2 OUT` writes the ~3B Qwen2-shaped
one with the default model's tokenizer; tests/fixtures/qwen35_checkpoint.py the Qwen3.5-4B shape), one
prompt x 8 completions x at most 512 tokens a step, LoRA r16 on the same projections, bf16,
gradient checkpointing, 2 GiB of KV cache, sleep mode. Sides:
  ours-gpu         configs/qwen35_4b_24gb.yaml on the length task: CUDA graphs, merged weights
                   over CUDA IPC, the learner settings for short sequences (no activation offload,
                   no tiles); the learner capped at 24 GiB - weights - KV - 1.5 GiB
  ours-gpu-recipe  the same recipe as it ran before: eager, LoRA adapter sync through the object
                   store, activation offload and MLP tiles
  trl-gpu          TRL's GRPOTrainer, vLLM colocate with sleep mode and PEFT, eager (as the 24 GB
                   recipe ran vLLM), its process capped at 24 GiB
  trl-gpu-graphs   the same with CUDA graphs (TRL's own default)
Each side also reports generated tokens/s of its rollout phase and the card's peak memory (every
process, nvidia-smi every 100 ms).

    python -m bench.trl_grpo --gpu --model /tmp/qwen2-3b --steps 6 --sides ours-gpu,trl-gpu --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GROUP, MAX_TOKENS, LR = 8, 64, 2e-3


def ours_overrides(run_dir: Path, steps: int) -> list[str]:
    return [f"trainer.run_dir={run_dir}", f"trainer.steps={steps}", "trainer.batch_size=1",
            f"trainer.group_size={GROUP}", f"trainer.checkpoint_every={steps}", f"rollout.max_tokens={MAX_TOKENS}",
            "rollout.num_cpus=1", "learner.torch_threads=1", "lora.rank=16", "lora.alpha=32",
            f"learner.lr={LR}", "learner.gradient_checkpointing=false", "sync.strategy=merged_on_engine"]


PHASES = ("time_rollout_s", "time_rollout_wait_s", "time_learn_s", "time_sync_s", "time_sync_hidden_s", "time_probe_s",
          "time_sleep_s", "time_wake_s")


def run_ours(steps: int, extra: tuple[str, ...] = ()) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-ours-")) / "run"
    launch = time.time()
    out = subprocess.run([sys.executable, "-m", "cli.main", "train", "configs/length.yaml",
                          *ours_overrides(run_dir, steps), *extra], cwd=ROOT, check=True, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return _ours_result(run_dir, out.stdout, launch)


def _ours_result(run_dir: Path, stdout: str, launch: float) -> dict:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # a record is written when its step ends; the first step's phases give its start, unless the
    # run says when its first rollout request left (step 1 then rolls out while the learner builds)
    first = recs[0]
    first_step = sum(first.get(k, 0.0) for k in ("time_rollout_s", "time_learn_s", "time_sync_s", "time_probe_s"))
    said = re.search(r"first rollout request ([0-9.]+)s after launch", stdout)
    return {"startup_s": float(said.group(1)) if said else first["time"] - first_step - launch,
            "step_s": [b["time"] - a["time"] for a, b in zip(recs, recs[1:])],
            "first_step_s": first_step, "reward_mean": [r["reward_mean"] for r in recs],
            "completion_tokens_mean": [r["gen_tokens_mean"] for r in recs],
            "phases": [{k: round(r[k], 2) for k in PHASES if k in r} for r in recs]}


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


# ---- GPU side ------------------------------------------------------------------------------------
GPU_GROUP, GPU_MAX_TOKENS, GPU_LR, KV_GIB, CONTEXTS_GIB = 8, 512, 1e-5, 2.0, 1.5
GPU_RECIPE = "configs/qwen35_4b_24gb.yaml"
SHORT = ("learner.activation_offload=false", "learner.mlp_tile_tokens=0", "learner.linear_attn_segment_tokens=0")
RECIPE_BEFORE = ("rollout.enforce_eager=true", "sync.strategy=lora",
                 "learner.linear_attn_segment_tokens=0")
GPU_KEYS = ("gen_tokens", "gen_tokens_per_s", "parity_gap", "learner/peak_mem_gib", "mem/awake_gib", "mem/asleep_gib",
            "mem/woken_gib")


def weights_gib(model: str) -> float:
    return sum(f.stat().st_size for f in Path(model).glob("*.safetensors")) / 2**30


def learner_cap_gib(model: str, card_gib: float) -> float:
    """What is left of the card for the learner once the engine is awake beside it."""
    return card_gib - weights_gib(model) - KV_GIB - CONTEXTS_GIB


class CardPeak:
    """Peak memory in use on GPU 0 by every process, sampled by nvidia-smi every 100 ms."""

    def __enter__(self) -> "CardPeak":
        import threading
        self.peak_mib = 0.0
        self._proc = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                       "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.peak_mib = max(self.peak_mib, float(line.strip()))
            except ValueError:
                pass

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        self._proc.wait()
        self._thread.join(timeout=2)

    @property
    def peak_gib(self) -> float:
        return self.peak_mib / 1024


def _child_env() -> dict:
    """This checkout first on the path, the rest kept (the GPU stack may live on PYTHONPATH)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def card_total_gib() -> float:
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return float(out.strip()) / 1024


def run_ours_gpu(a, extra: tuple[str, ...] = ()) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-ours-gpu-")) / "run"
    total = card_total_gib()
    overrides = [f"model.path={a.model}", "task.kind=length", "trainer.batch_size=1", f"trainer.group_size={GPU_GROUP}",
                 f"trainer.steps={a.steps}", f"trainer.checkpoint_every={a.steps}", f"trainer.run_dir={run_dir}",
                 f"rollout.max_tokens={GPU_MAX_TOKENS}", "rollout.max_model_len=2048", f"rollout.kv_cache_memory_gib={KV_GIB}",
                 f"learner.gpu_memory_fraction={learner_cap_gib(a.model, a.card_gib) / total:.4f}",
                 f"learner.lr={GPU_LR}", "logging.backends=[]", "logging.progress=false", *SHORT, *extra]
    if json.loads(Path(a.model, "config.json").read_text()).get("model_type") != "qwen3_5":
        overrides.append("model.tool_call_parser=hermes")  # the default model's tokenizer renders tools hermes-style
    launch = time.time()
    with CardPeak() as card:
        out = subprocess.run([sys.executable, "-m", "cli.main", "train", GPU_RECIPE, *overrides], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_child_env())
    if out.returncode != 0:
        raise RuntimeError(f"ours-gpu exited {out.returncode}:\n{out.stdout[-4000:]}")
    res = _ours_result(run_dir, out.stdout, launch)
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    res.update({"card_peak_gib": card.peak_gib, "overrides": overrides,
                "steps": [{k: r[k] for k in GPU_KEYS if k in r} for r in recs],
                "log_tail": [line for line in out.stdout.splitlines() if "[rlvr]" in line or "engine:" in line][-30:]})
    return res


def run_trl_gpu(a, eager: bool) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench-trl-gpu-")) / "times.json"
    launch = time.time()
    with CardPeak() as card:
        done = subprocess.run([sys.executable, "-m", "bench.trl_grpo", "--trl-gpu-child", str(out), "--model", a.model,
                               "--steps", str(a.steps), "--card-gib", str(a.card_gib), *(["--eager"] if eager else [])],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_child_env())
    if done.returncode != 0:
        raise RuntimeError(f"trl-gpu exited {done.returncode}:\n{done.stdout[-4000:]}")
    t = json.loads(out.read_text())
    tokens = [(n or 0) * GPU_GROUP for n in t["length"]]
    return {"startup_s": t["begin"][0] - launch, "step_s": [b - a for a, b in zip(t["end"], t["end"][1:])],
            "first_step_s": t["end"][0] - t["begin"][0], "reward_mean": t["reward"],
            "completion_tokens_mean": t["length"], "card_peak_gib": card.peak_gib, "torch_peak_gib": t["peak_gib"],
            "phases": [{"generate_s": round(g, 2), "step_s": round(e - b, 2)}
                       for g, b, e in zip(t["generate"], t["begin"], t["end"])],
            "steps": [{"gen_tokens": n, "gen_tokens_per_s": n / g} for n, g in zip(tokens, t["generate"])]}


def trl_gpu_child(out: str, model: str, steps: int, card_gib: float, eager: bool) -> None:
    """TRL's GRPOTrainer, vLLM colocated in its process: writes step times, generate seconds, peak."""
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    import functools

    import torch
    torch.cuda.set_per_process_memory_fraction(min(1.0, card_gib / (torch.cuda.mem_get_info()[1] / 2**30)))
    import trl.generation.vllm_generation as vllm_generation
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from rl.config import RunConfig
    from rl.length_reward import LENGTH_PROMPTS

    # TRL builds vLLM itself; its engine gets the same KV cache as ours, and eager as the recipe ran it
    vllm_generation.LLM = functools.partial(vllm_generation.LLM, enforce_eager=eager,
                                            kv_cache_memory_bytes=int(KV_GIB * 2**30))
    times: dict[str, list] = {"begin": [], "end": [], "reward": [], "length": [], "generate": []}

    def shorter(completion_ids, **kw):  # rl.length_reward's rule on token ids
        return [0.0 if len(ids) >= GPU_MAX_TOKENS else 1.0 - len(ids) / GPU_MAX_TOKENS for ids in completion_ids]

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in LENGTH_PROMPTS])
    args = GRPOConfig(output_dir=str(Path(out).parent / "trl"), per_device_train_batch_size=GPU_GROUP,
                      num_generations=GPU_GROUP, max_completion_length=GPU_MAX_TOKENS, max_steps=steps,
                      learning_rate=GPU_LR, temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no",
                      report_to=[], bf16=True, gradient_checkpointing=True, dataloader_num_workers=0, seed=0,
                      use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True,
                      vllm_gpu_memory_utilization=0.3, vllm_max_model_length=2048,
                      model_init_kwargs={"dtype": "bfloat16"})
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=RunConfig().lora.target_modules,
                      task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=shorter, args=args, train_dataset=data, peft_config=lora,
                          callbacks=[_clock(times, torch.cuda.synchronize)])
    generate = trainer._generate_and_score_completions  # its rollout phase, timed from outside

    def timed_generate(*a, **kw):
        t0 = time.time()
        try:
            return generate(*a, **kw)
        finally:
            times["generate"].append(time.time() - t0)

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    times["peak_gib"] = torch.cuda.max_memory_reserved() / 2**30
    Path(out).write_text(json.dumps(times))


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


GPU_SIDES = {"ours-gpu": lambda a: run_ours_gpu(a), "ours-gpu-recipe": lambda a: run_ours_gpu(a, RECIPE_BEFORE),
             "trl-gpu": lambda a: run_trl_gpu(a, eager=True), "trl-gpu-graphs": lambda a: run_trl_gpu(a, eager=False)}


def _median_phases(res: dict) -> dict:
    """Each phase's median over the steady steps (after the first)."""
    steady = res["phases"][1:] or res["phases"]
    return {k: statistics.median(p[k] for p in steady if k in p) for k in {k for p in steady for k in p}}


def gpu_main(a) -> None:
    """Alternate the GPU sides; the JSON is rewritten after every side, so a cut-off run keeps what ran."""
    sides = a.sides.split(",")
    unknown = [s for s in sides if s not in GPU_SIDES]
    if unknown:
        raise SystemExit(f"unknown GPU side(s) {unknown}; of {', '.join(GPU_SIDES)}")
    started = time.time()
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    errors: list[str] = []
    meta = {"model": a.model, "weights_gib": weights_gib(a.model), "card_total_gib": card_total_gib(),
            "card_cap_gib": a.card_gib, "learner_cap_gib": learner_cap_gib(a.model, a.card_gib),
            "gpu": subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=name", "--format=csv,noheader"],
                                  stdout=subprocess.PIPE, text=True).stdout.strip(),
            "group": GPU_GROUP, "max_tokens": GPU_MAX_TOKENS, "steps": a.steps}
    for r in range(a.rounds):
        for name in (sides if r % 2 == 0 else sides[::-1]):
            if a.budget_s and time.time() - started > a.budget_s:
                errors.append(f"round {r + 1} {name}: not run (--budget-s {a.budget_s} spent)")
                continue
            try:
                res = GPU_SIDES[name](a)
            except Exception as e:  # one side failing still leaves the others' records
                errors.append(f"round {r + 1} {name}: {e}")
                print(f"round {r + 1} {name:>16}: FAILED {str(e)[-3000:]}", flush=True)
                continue
            res["phase_medians"] = _median_phases(res)
            runs[name].append(res)
            rate = statistics.median(s["gen_tokens_per_s"] for s in res["steps"][1:] or res["steps"])
            print(f"round {r + 1} {name:>16}: start-up {res['startup_s']:.1f}s, steps "
                  f"{[round(s, 2) for s in res['step_s']]}, phases {res['phase_medians']}, {rate:.0f} tok/s, "
                  f"card peak {res['card_peak_gib']:.1f} GiB", flush=True)
            _write_gpu(a, meta, runs, errors)
    summary = _write_gpu(a, meta, runs, errors)
    print(f"\n{meta['gpu']}; {GPU_GROUP} completions x {GPU_MAX_TOKENS} tokens; card capped at {a.card_gib} GiB")
    print(f"{'side':>16} | {'start-up s':>10} | {'step s':>6} | {'tok/s':>6} | {'card peak GiB':>13} | phases (median s)")
    for name, m in summary.items():
        print(f"{name:>16} | {m['startup_s']:>10.1f} | {m['steady_step_s']:>6.2f} | {m['gen_tokens_per_s']:>6.0f} | "
              f"{m['card_peak_gib']:>13.1f} | {m['phases']}")
    for e in errors:
        print("not measured:", e[:300])


def _write_gpu(a, meta: dict, runs: dict, errors: list) -> dict:
    summary = {}
    for name, rs in runs.items():
        if not rs:
            continue
        steps = [s for r in rs for s in r["step_s"]]
        summary[name] = {"startup_s": [round(r["startup_s"], 1) for r in rs], "steady_step_s": statistics.median(steps),
                         "gen_tokens_per_s": statistics.median(s["gen_tokens_per_s"] for r in rs
                                                               for s in r["steps"][1:] or r["steps"]),
                         "card_peak_gib": max(r["card_peak_gib"] for r in rs),
                         "phases": rs[-1]["phase_medians"]}
    for name in summary:
        if name.startswith("ours") and "trl-gpu" in summary:
            summary[name]["vs_trl_gpu"] = summary[name]["steady_step_s"] / summary["trl-gpu"]["steady_step_s"]
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs, "errors": errors},
                                           indent=1))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sides", default="ours,ours-ahead,trl,trl-2t", help=f"comma-separated, of {', '.join(SIDES)}")
    ap.add_argument("--json")
    ap.add_argument("--trl-child", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gpu", action="store_true", help="the GPU side (sides: " + ", ".join(GPU_SIDES) + ")")
    ap.add_argument("--model", help="--gpu: the checkpoint folder both sides train")
    ap.add_argument("--card-gib", type=float, default=24.0, help="--gpu: the card size to stand in for")
    ap.add_argument("--budget-s", type=float, default=0, help="--gpu: start no side after this many seconds")
    ap.add_argument("--build-qwen2", metavar="OUT", help="write the random ~3B Qwen2 checkpoint and exit")
    ap.add_argument("--tokenizer", help="--build-qwen2: tokenizer folder (default: the default model's)")
    ap.add_argument("--trl-gpu-child", help=argparse.SUPPRESS)
    ap.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_qwen2:
        if not args.tokenizer:
            from modeling.default_model import resolve_model_path
            args.tokenizer = resolve_model_path("default")
        print(json.dumps(build_qwen2(args.build_qwen2, args.tokenizer)))
        return
    if args.trl_gpu_child:
        trl_gpu_child(args.trl_gpu_child, args.model, args.steps, args.card_gib, args.eager)
        return
    if args.gpu:
        if not args.model:
            ap.error("--gpu needs --model")
        if args.sides == ap.get_default("sides"):
            args.sides = "ours-gpu,trl-gpu"
        gpu_main(args)
        return
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
