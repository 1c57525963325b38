"""Our GRPO step vs TRL's on one CUDA card standing in for a 24 GiB one, at equal work,
alternated in one run (`python -m bench.trl_grpo --gpu ...` runs it).

Equal work: every completion is exactly --gen-tokens long on every side (vLLM's ignore_eos:
ours `rollout.ignore_eos=true`, TRL `generation_kwargs={"ignore_eos": True}`, which TRL 1.16
passes to its colocated engine's SamplingParams), so a step's time compares like for like; the
length reward on both sides reads where the first end token fell, so groups still differ and
every step trains. The job: --prompts prompts x --group completions a step, LoRA r16 on the same
projections, bf16, gradient checkpointing, --kv-gib of KV cache, sleep mode; a random checkpoint
(`--build-qwen2 OUT` writes the ~3B Qwen2 one; tests/fixtures/qwen35_checkpoint.py the Qwen3.5-4B
shape). --prompt-tokens lengthens each prompt (task.length_prompt_tokens): the context shape of
an agent's call (our sides only). Sides:
  ours-gpu         configs/qwen35_4b_24gb.yaml on the length task: CUDA graphs, merged weights over
                   CUDA IPC, the learner settings for short sequences (no activation offload, no
                   tiles); the learner capped at card - weights - KV - 1.5 GiB
  ours-gpu-long    the same with the recipe's learner settings for long sequences as shipped
                   (activation offload, MLP tiles, Gated-DeltaNet segments): the agentic shape
  ours-gpu-recipe  the recipe as it ran before: eager, LoRA adapter sync through the object store,
                   activation offload and MLP tiles
  trl-gpu          TRL's GRPOTrainer, vLLM colocate with sleep mode and PEFT, eager (as the 24 GB
                   recipe ran vLLM), its process capped at the card size
  trl-gpu-graphs   the same with CUDA graphs (TRL's own default)
Each run is a fresh process, launched as a user launches it. Per run: start-up to the first step
(ours: the first rollout request, as the run's start-up line states it; TRL: the first step's
begin) with its split (ours: the start-up line's phases; both: the engine's own lines: weights,
torch.compile, graph capture, whether the compile cache was read), the step times (one step's end
to the next one's; steady state = the median after the first), ms per generated token of a
steady step (the like-for-like number), the rollout phase's tokens/s (ours: generation alone; TRL:
`_generate_and_score_completions`, its weight push, generation, rewards and old log-probs
together), the card's peak memory (every process, nvidia-smi every
100 ms). A side named twice runs twice: the first start of a fresh machine compiles (cold), a
later one reads the compile cache (ours: RLVR_HOME/vllm-cache; TRL: vLLM's default cache).
--deadline-s bounds the whole run: a side is not started without --min-side-s left and is
stopped (with what it measured so far) at the deadline; the JSON is rewritten after every side.

    python -m bench.trl_grpo --gpu --model /tmp/qwen2-3b --steps 4 --sides ours-gpu,trl-gpu,trl-gpu-graphs,ours-gpu \\
        --deadline-s 400 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.ours_runs import ours_result, records, startup_phases

ROOT = Path(__file__).resolve().parents[1]

LR, CONTEXTS_GIB = 1e-5, 1.5
RECIPE = "configs/qwen35_4b_24gb.yaml"
SHORT = ("learner.activation_offload=false", "learner.mlp_tile_tokens=0", "learner.linear_attn_segment_tokens=0")
RECIPE_BEFORE = ("rollout.enforce_eager=true", "sync.strategy=lora", "learner.linear_attn_segment_tokens=0")
STEP_KEYS = ("gen_tokens", "gen_tokens_per_s", "train_samples", "reward_mean", "parity_gap", "learner/peak_mem_gib",
             "mem/awake_gib", "mem/asleep_gib", "mem/woken_gib")

# vLLM's own start-up lines (0.26 and 0.32 word them alike): what each costs, and whether the
# compile cache was read
ENGINE_LINES = {
    "model_load_s": r"Model loading took [0-9.]+ GiB (?:memory )?and ([0-9.]+) seconds",
    "dynamo_s": r"Dynamo bytecode transform time: ([0-9.]+) s",
    "torch_compile_s": r"torch\.compile took ([0-9.]+) s in total",
    "graph_capture_s": r"Graph capturing finished in ([0-9.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s",
    "kv_cache_tokens": r"GPU KV cache size: ([0-9,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [0-9,]+ tokens per request: ([0-9.]+)x",
}
CACHE_HIT = "Directly load the compiled graph"
CACHE_MISS = "Compiling a graph for compile range"
CACHE_DIR = r"Using cache directory: (\S+) for vLLM's torch\.compile"


@dataclass
class Job:
    """The work one step does, the same on every side."""
    model: str
    steps: int = 4
    prompts: int = 1           # groups a step
    group: int = 8             # completions a prompt
    gen_tokens: int = 512      # every completion exactly this long
    prompt_tokens: int = 0     # 0: the length prompts as written
    kv_gib: float = 2.0
    card_gib: float = 24.0

    @property
    def max_model_len(self) -> int:
        return max(2048, self.prompt_tokens + self.gen_tokens + 256)

    @property
    def tokens_per_step(self) -> int:
        return self.prompts * self.group * self.gen_tokens


class SideFailed(RuntimeError):
    """A side that exited badly or ran out of time; `partial` holds what it measured."""

    def __init__(self, message: str, partial: dict):
        super().__init__(message)
        self.partial = partial


def weights_gib(model: str) -> float:
    return sum(f.stat().st_size for f in Path(model).glob("*.safetensors")) / 2**30


def learner_cap_gib(job: Job) -> float:
    """What is left of the card for the learner once the engine is awake beside it."""
    return job.card_gib - weights_gib(job.model) - job.kv_gib - CONTEXTS_GIB


class CardPeak:
    """Peak memory in use on GPU 0 by every process, sampled by nvidia-smi every 100 ms."""

    def __enter__(self) -> "CardPeak":
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
            except ValueError:  # a blank or header line between samples
                pass

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        self._proc.wait()
        self._thread.join(timeout=2)

    @property
    def peak_gib(self) -> float:
        return self.peak_mib / 1024


def card_used_gib() -> float:
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return float(out.strip()) / 1024


def card_total_gib() -> float:
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return float(out.strip()) / 1024


def wait_card_free(limit_s: float = 30.0, below_gib: float = 1.0) -> float:
    """Wait until the previous side's processes have let go of the card (their memory would count
    in the next side's peak); returns what is still in use."""
    deadline = time.monotonic() + limit_s
    while (used := card_used_gib()) > below_gib and time.monotonic() < deadline:
        time.sleep(1.0)
    return used


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict:
    """This checkout first on the path, the rest kept (the GPU stack may live on PYTHONPATH)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            **extra}


_RUNNING: list[subprocess.Popen] = []  # the sessions run_bounded has started and not yet seen end


def stop_children_on_term() -> None:
    """A bench stopped from outside (SIGTERM: its caller's deadline) stops the sessions it started
    first: they are not in its process group, and an engine left running holds the card."""
    def stop(signum, frame):
        for proc in list(_RUNNING):
            _stop_session(proc)
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)


def run_bounded(cmd: list[str], env: dict, timeout_s: float, tag: str) -> tuple[str, int, bool]:
    """Run cmd in its own session, its output echoed with `tag` and kept; past timeout_s the whole
    session is stopped (TERM, then KILL). Returns (output, exit status, timed out)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    _RUNNING.append(proc)
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            print(f"  {tag}| {line.rstrip()[:400]}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        timed_out = True
        print(f"  {tag}| -- stopped after {timeout_s:.0f} s (the run's deadline)", flush=True)
        _stop_session(proc)
    finally:
        _RUNNING.remove(proc)
    reader.join(timeout=10)
    return "".join(lines), proc.returncode, timed_out


def _stop_session(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def engine_lines(text: str) -> dict:
    """The engine's start-up costs and compile-cache use, read from its log lines."""
    out: dict = {}
    for key, pattern in ENGINE_LINES.items():
        found = re.findall(pattern, text)
        if found:
            out[key] = float(found[0].replace(",", ""))
    cache = re.findall(CACHE_DIR, text)
    out["compile_cache_dir"] = cache[0] if cache else None
    out["compile_cache"] = ("read" if CACHE_HIT in text else "compiled" if CACHE_MISS in text else
                            "none (eager)" if "torch_compile_s" not in out else "unknown")
    return out


def cache_files(path: Path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _logs_text(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*.log")))


# ---- our side -----------------------------------------------------------------------------------
def ours_overrides(job: Job, run_dir: Path, total_gib: float, extra: tuple[str, ...] = ()) -> list[str]:
    overrides = [f"model.path={job.model}", "task.kind=length", f"task.length_prompt_tokens={job.prompt_tokens}",
                 f"trainer.batch_size={job.prompts}", f"trainer.group_size={job.group}", f"trainer.steps={job.steps}",
                 f"trainer.checkpoint_every={job.steps}", f"trainer.run_dir={run_dir}",
                 f"rollout.max_tokens={job.gen_tokens}", "rollout.ignore_eos=true",
                 f"rollout.max_model_len={job.max_model_len}", f"rollout.kv_cache_memory_gib={job.kv_gib}",
                 f"learner.gpu_memory_fraction={learner_cap_gib(job) / total_gib:.4f}",
                 f"learner.lr={LR}", "logging.backends=[]", "logging.progress=false", *extra]
    if json.loads(Path(job.model, "config.json").read_text()).get("model_type") != "qwen3_5":
        overrides.append("model.tool_call_parser=hermes")  # the default model's tokenizer renders tools hermes-style
    return overrides


def run_ours_gpu(job: Job, timeout_s: float, extra: tuple[str, ...] = (), tag: str = "ours") -> dict:
    from rl.paths import vllm_cache_dir

    run_dir = Path(tempfile.mkdtemp(prefix="bench-ours-gpu-")) / "run"
    overrides = ours_overrides(job, run_dir, card_total_gib(), extra)
    cache = vllm_cache_dir()
    before = cache_files(cache)
    launch = time.time()
    with CardPeak() as card:
        out, rc, timed_out = run_bounded([sys.executable, "-m", "cli.main", "train", RECIPE, *overrides], child_env(),
                                         timeout_s, tag)
    res: dict = {"rc": rc, "timed_out": timed_out, "wall_s": time.time() - launch, "card_peak_gib": card.peak_gib,
                 "overrides": overrides, "cache_files_before": before, "cache_files_after": cache_files(cache)}
    logs = _logs_text(run_dir) if (run_dir / "logs").is_dir() else ""
    res["startup_split"] = {"phases": startup_phases(out), "engine": engine_lines(logs)}
    recs = records(run_dir)
    if recs:
        res.update(ours_result(run_dir, out, launch))
        res["steps"] = [{k: r[k] for k in STEP_KEYS if k in r} for r in recs]
    if rc != 0 or not recs:
        tail = "".join(logs.splitlines(keepends=True)[-60:])
        why = f"stopped at the deadline after {timeout_s:.0f} s" if timed_out else f"exited {rc}"
        raise SideFailed(f"{tag} {why} after {len(recs)} step(s):\n{out[-3000:]}\n-- actor logs, last lines:\n{tail}",
                         res)
    return res


# ---- TRL's side ---------------------------------------------------------------------------------
def trl_env() -> dict:
    """TRL's colocated vLLM joins a torch.distributed group (vLLM's external launcher): the single
    process's rendezvous, as torchrun sets it for one process, on a free port."""
    return child_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()))


def trl_cache_dir() -> Path:
    root = os.environ.get("VLLM_CACHE_ROOT")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm"


def run_trl_gpu(job: Job, timeout_s: float, eager: bool, tag: str = "trl") -> dict:
    if job.prompt_tokens:
        raise SideFailed("TRL's sides take the length prompts as written (--prompt-tokens is for ours only)", {})
    out = Path(tempfile.mkdtemp(prefix="bench-trl-gpu-")) / "times.json"
    before = cache_files(trl_cache_dir())
    launch = time.time()
    with CardPeak() as card:
        text, rc, timed_out = run_bounded([sys.executable, "-m", "bench.trl_grpo", "--trl-gpu-child", str(out),
                                           "--job", json.dumps(asdict(job)), *(["--eager"] if eager else [])],
                                          trl_env(), timeout_s, tag)
    res: dict = {"rc": rc, "timed_out": timed_out, "wall_s": time.time() - launch, "card_peak_gib": card.peak_gib,
                 "cache_files_before": before, "cache_files_after": cache_files(trl_cache_dir())}
    t = json.loads(out.read_text()) if out.is_file() else {}
    res["startup_split"] = {"phases": {k: round(t[k] - launch, 1) for k in ("started", "imported", "trainer_built")
                                       if k in t}, "engine": engine_lines(text)}
    if t.get("begin"):
        tokens = [round((n or 0) * job.prompts * job.group) for n in t["length"]]
        res.update({"startup_s": t["begin"][0] - launch, "step_s": [b - a for a, b in zip(t["end"], t["end"][1:])],
                    "first_step_s": t["end"][0] - t["begin"][0] if t["end"] else None, "reward_mean": t["reward"],
                    "completion_tokens_mean": t["length"], "torch_peak_gib": t.get("peak_gib"),
                    "phases": [{"generate_s": round(g, 2), "step_s": round(e - b, 2)}
                               for g, b, e in zip(t["generate"], t["begin"], t["end"])],
                    "steps": [{"gen_tokens": n, "gen_tokens_per_s": n / g} for n, g in zip(tokens, t["generate"])]})
    if rc != 0 or not t.get("end"):
        why = f"stopped at the deadline after {timeout_s:.0f} s" if timed_out else f"exited {rc}"
        raise SideFailed(f"{tag} {why} after {len(t.get('end', []))} step(s):\n{text[-4000:]}", res)
    return res


def trl_gpu_child(out: str, job: Job, eager: bool) -> None:
    """TRL's GRPOTrainer, vLLM colocated in its process: writes step times, generate seconds and
    the peak to `out` after every step (a run stopped at its deadline keeps the steps it made)."""
    times: dict = {"started": time.time(), "begin": [], "end": [], "reward": [], "length": [], "generate": []}
    missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise SystemExit(f"trl-gpu child: {missing} not set (the bench's trl_env() sets the single-process rendezvous)")
    import functools

    import torch
    torch.cuda.set_per_process_memory_fraction(min(1.0, job.card_gib / (torch.cuda.mem_get_info()[1] / 2**30)))
    import trl.generation.vllm_generation as vllm_generation
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl.config import RunConfig
    from rl.length_reward import LENGTH_PROMPTS
    times["imported"] = time.time()

    def flush() -> None:
        times["peak_gib"] = torch.cuda.max_memory_reserved() / 2**30
        Path(out).write_text(json.dumps(times))

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            times["begin"].append(time.time())

        def on_step_end(self, args, state, control, **kw):
            torch.cuda.synchronize()
            times["end"].append(time.time())
            flush()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                times["reward"].append(logs["reward"])
                times["length"].append(logs.get("completions/mean_length"))

    # TRL builds vLLM itself; its engine gets the same KV cache as ours, and eager as the recipe ran it
    vllm_generation.LLM = functools.partial(vllm_generation.LLM, enforce_eager=eager,
                                            kv_cache_memory_bytes=int(job.kv_gib * 2**30))
    end_ids = {AutoTokenizer.from_pretrained(job.model).eos_token_id}

    def shorter(completion_ids, **kw):  # rl.length_reward's rule on token ids: scored at the first end token
        def one(ids):
            first = next((i for i, t in enumerate(ids) if t in end_ids), None)
            if first is not None:
                return max(0.0, 1.0 - (first + 1) / job.gen_tokens)
            return 0.0 if len(ids) >= job.gen_tokens else 1.0 - len(ids) / job.gen_tokens
        return [one(ids) for ids in completion_ids]

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in LENGTH_PROMPTS])
    args = GRPOConfig(output_dir=str(Path(out).parent / "trl"), per_device_train_batch_size=job.prompts * job.group,
                      num_generations=job.group, max_completion_length=job.gen_tokens, max_steps=job.steps,
                      learning_rate=LR, temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no",
                      report_to=[], bf16=True, gradient_checkpointing=True, dataloader_num_workers=0, seed=0,
                      disable_tqdm=True, use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True,
                      vllm_gpu_memory_utilization=0.3, vllm_max_model_length=job.max_model_len,
                      generation_kwargs={"ignore_eos": True},  # every completion gen_tokens long, as ours
                      model_init_kwargs={"dtype": "bfloat16"})
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=RunConfig().lora.target_modules,
                      task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=job.model, reward_funcs=shorter, args=args, train_dataset=data, peft_config=lora,
                          callbacks=[Clock()])
    times["trainer_built"] = time.time()
    generate = trainer._generate_and_score_completions  # its rollout phase, timed from outside

    def timed_generate(*a, **kw):
        t0 = time.time()
        try:
            return generate(*a, **kw)
        finally:
            times["generate"].append(time.time() - t0)

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    flush()


SIDES = {"ours-gpu": lambda job, t, tag: run_ours_gpu(job, t, SHORT, tag),
         "ours-gpu-long": lambda job, t, tag: run_ours_gpu(job, t, (), tag),
         "ours-gpu-recipe": lambda job, t, tag: run_ours_gpu(job, t, RECIPE_BEFORE, tag),
         "trl-gpu": lambda job, t, tag: run_trl_gpu(job, t, True, tag),
         "trl-gpu-graphs": lambda job, t, tag: run_trl_gpu(job, t, False, tag)}


# ---- the run and its table ----------------------------------------------------------------------
def _median_phases(res: dict) -> dict:
    """Each phase's median over the steady steps (after the first)."""
    steady = res["phases"][1:] or res["phases"]
    return {k: round(statistics.median(p[k] for p in steady if k in p), 2) for k in {k for p in steady for k in p}}


def gpu_main(a) -> dict:
    """Alternate the sides (a list, in order; a side named twice runs twice); returns the summary."""
    stop_children_on_term()
    sides = a.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise SystemExit(f"unknown GPU side(s) {unknown}; of {', '.join(SIDES)}")
    job = Job(model=a.model, steps=a.steps, prompts=a.prompts, group=a.group, gen_tokens=a.gen_tokens,
              prompt_tokens=a.prompt_tokens, kv_gib=a.kv_gib, card_gib=a.card_gib)
    started = time.monotonic()
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    errors: list[str] = []
    meta = {"job": asdict(job), "tokens_per_step": job.tokens_per_step, "max_model_len": job.max_model_len,
            "weights_gib": weights_gib(job.model), "card_total_gib": card_total_gib(),
            "learner_cap_gib": learner_cap_gib(job), "sides": sides, "deadline_s": a.deadline_s,
            "gpu": subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=name", "--format=csv,noheader"],
                                  stdout=subprocess.PIPE, text=True).stdout.strip()}
    for i, name in enumerate(sides):
        tag = f"{i + 1}:{name}"
        meta.setdefault("card_used_before_gib", []).append(round(wait_card_free(), 2))
        left = a.deadline_s - (time.monotonic() - started) if a.deadline_s else 3600.0
        if left < a.min_side_s:
            errors.append(f"{tag}: not run ({left:.0f} s left of --deadline-s {a.deadline_s:.0f})")
            print(f"{tag}: not run ({left:.0f} s left)", flush=True)
            continue
        print(f"== {tag} (up to {left:.0f} s)", flush=True)
        try:
            res = SIDES[name](job, left, tag)
        except SideFailed as e:
            errors.append(f"{tag}: {str(e)[:1500]}")
            print(f"{tag}: FAILED {str(e)[-3000:]}", flush=True)
            res = {**e.partial, "failed": True}
            if not res.get("step_s") and not res.get("phases"):
                runs[name].append({**res, "partial": True})
                _write(a, meta, runs, errors)
                continue
        except Exception as e:  # the bench's own reading of a side broke: the sides after it still run
            errors.append(f"{tag}: {type(e).__name__}: {e}")
            print(f"{tag}: FAILED reading its records: {type(e).__name__}: {e}", flush=True)
            _write(a, meta, runs, errors)
            continue
        res["run"] = len(runs[name]) + 1
        res["phase_medians"] = _median_phases(res) if res.get("phases") else {}
        runs[name].append(res)
        print(f"{tag}: start-up {res.get('startup_s', float('nan')):.1f} s "
              f"(cache {res['startup_split']['engine'].get('compile_cache')}), steps "
              f"{[round(s, 2) for s in res.get('step_s', [])]}, phases {res['phase_medians']}, "
              f"card peak {res['card_peak_gib']:.1f} GiB", flush=True)
        _write(a, meta, runs, errors)
    summary = _write(a, meta, runs, errors)
    print_table(meta, summary, errors)
    return summary


def trained_steps(res: dict, samples: int) -> tuple[list[float], int]:
    """A run's steady step times whose update trained on every sample (equal work: our loop skips
    the update of a step whose groups all tie, TRL's trainer never does), and how many were left out."""
    steps = res.get("steps", [])
    kept = [s for j, s in enumerate(res.get("step_s", []))
            if j + 1 >= len(steps) or steps[j + 1].get("train_samples", samples) == samples]
    return kept, len(res.get("step_s", [])) - len(kept)


def summarize(meta: dict, runs: dict) -> dict:
    """Per side: every run's start-up (with its compile-cache use), the steady step over all its runs,
    ms per generated token, the rollout's tokens/s, the card's peak; ours against TRL."""
    job_tokens, samples = meta["tokens_per_step"], meta["job"]["prompts"] * meta["job"]["group"]
    summary: dict = {}
    for name, rs in runs.items():
        done = [r for r in rs if r.get("startup_s") is not None]
        if not done:
            continue
        kept = [trained_steps(r, samples) for r in done]
        steady = [s for k, _ in kept for s in k]
        rates = [s["gen_tokens_per_s"] for r in done for s in (r.get("steps", [])[1:] or r.get("steps", []))
                 if s.get("gen_tokens_per_s")]
        step = statistics.median(steady) if steady else None
        summary[name] = {
            "startup_s": [round(r["startup_s"], 1) for r in done],
            "compile_cache": [r["startup_split"]["engine"].get("compile_cache") for r in done],
            "startup_split": [r["startup_split"] for r in done],
            "steady_step_s": step, "steady_steps": len(steady),
            "steps_left_out": sum(n for _, n in kept),  # no update: every group's rewards tied
            "ms_per_token": step / job_tokens * 1e3 if step else None,
            "gen_tokens_per_s": statistics.median(rates) if rates else None,
            "card_peak_gib": max(r["card_peak_gib"] for r in done),
            "phases": done[-1].get("phase_medians", {})}
    for base in ("trl-gpu-graphs", "trl-gpu"):
        if summary.get(base, {}).get("steady_step_s"):
            for name, m in summary.items():
                if name.startswith("ours") and m["steady_step_s"]:
                    m[f"vs_{base}"] = m["steady_step_s"] / summary[base]["steady_step_s"]
    return summary


def _write(a, meta: dict, runs: dict, errors: list) -> dict:
    summary = summarize(meta, runs)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs, "errors": errors},
                                           indent=1))
    return summary


def _num(x, fmt: str) -> str:
    """x in fmt (e.g. '6.2f'), or a dash as wide."""
    return format("-", f">{fmt.split('.')[0]}") if x is None else format(x, fmt)


def print_table(meta: dict, summary: dict, errors: list) -> None:
    job = meta["job"]
    print(f"\n{meta['gpu']}; {job['prompts']} prompt(s) x {job['group']} completions x exactly {job['gen_tokens']} "
          f"tokens ({meta['tokens_per_step']} a step), "
          f"{str(job['prompt_tokens']) + '-token prompts' if job['prompt_tokens'] else 'the length prompts'}; "
          f"card capped at {job['card_gib']} GiB")
    print(f"{'side':>16} | {'start-up s (compile cache)':>34} | {'step s':>6} | {'ms/token':>8} | {'tok/s':>6} | "
          f"{'card peak GiB':>13} | {'vs trl graphs':>13} | phases (median s)")
    for name, m in summary.items():
        start = " / ".join(f"{s:.1f} ({c})" for s, c in zip(m["startup_s"], m["compile_cache"]))
        print(f"{name:>16} | {start:>34} | {_num(m['steady_step_s'], '6.2f')} | {_num(m['ms_per_token'], '8.3f')} | "
              f"{_num(m['gen_tokens_per_s'], '6.0f')} | {m['card_peak_gib']:>13.1f} | "
              f"{_num(m.get('vs_trl-gpu-graphs'), '13.2f')} | {m['phases']}")
    for e in errors:
        print("not measured:", e.splitlines()[0][:300])


def add_gpu_args(ap) -> None:
    ap.add_argument("--model", help="--gpu: the checkpoint folder every side trains")
    ap.add_argument("--card-gib", type=float, default=24.0, help="--gpu: the card size to stand in for")
    ap.add_argument("--prompts", type=int, default=1, help="--gpu: prompts (groups) a step")
    ap.add_argument("--group", type=int, default=8, help="--gpu: completions a prompt")
    ap.add_argument("--gen-tokens", type=int, default=512, help="--gpu: every completion exactly this many tokens")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="--gpu: lengthen each prompt to this many tokens (ours only; 0: as written)")
    ap.add_argument("--kv-gib", type=float, default=2.0, help="--gpu: each engine's KV cache")
    ap.add_argument("--deadline-s", type=float, default=0, help="--gpu: stop the whole run after this many seconds "
                    "(a side running then is stopped and keeps its steps so far); 0: no limit")
    ap.add_argument("--min-side-s", type=float, default=60, help="--gpu: start no side with less than this left")
    ap.add_argument("--trl-gpu-child", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
