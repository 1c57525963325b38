"""RolloutWorker: one vLLM engine, the policy server in front of it, and the weight-sync target.

The engine loop and the `Policy` facade live in actors/engine.py; the policy server gets
the facade, never this worker, so imports run one way: rollout_worker -> policy_server ->
engine.
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import time

from actors.engine import EngineLoop, Policy, collect_completion, configure_engine_env, scored_logprobs
from actors.sync_cuda_ipc import WORKER_EXTENSION
from modeling.checkpoint_layout import CheckpointLayout
from rl.config import ModelConfig, RolloutConfig
from rl.folders import read_safetensors, write_folder
from rl.types import CallRecord, Completion

log = logging.getLogger("rlvr.rollout")


class RolloutWorker:
    """Ray actor body (plain class): the driver wraps it with ray.remote(...).options(...)."""

    def __init__(self, model_path: str, rollout: RolloutConfig, model: ModelConfig,
                 enable_lora: bool = True, max_lora_rank: int = 16) -> None:
        configure_engine_env(rollout)
        from vllm import EngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine

        self.cfg = rollout
        self.model_cfg = model
        self.model_path = model_path
        self.on_cpu = current_platform.is_cpu()
        self.enable_lora = enable_lora
        sizing = {} if rollout.kv_cache_memory_gib is None else \
            {"kv_cache_memory_bytes": int(rollout.kv_cache_memory_gib * 2**30)}
        eager, why = rollout.eager(on_gpu=not self.on_cpu)
        log.info("engine: %s", why)
        # on GPU the engine's worker also loads merged weights from CUDA IPC handles (sync.strategy=cuda_ipc)
        extension = {} if self.on_cpu else {"worker_extension_cls": WORKER_EXTENSION}
        args = EngineArgs(
            model=model_path,
            dtype=model.resolved_dtype(on_gpu=not self.on_cpu) if rollout.dtype == "model" else rollout.dtype,
            max_model_len=rollout.max_model_len,
            enforce_eager=eager,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            enable_lora=enable_lora,
            max_lora_rank=max_lora_rank,
            max_loras=1,
            seed=rollout.seed,
            max_num_seqs=rollout.max_num_seqs,
            enable_prefix_caching=rollout.enable_prefix_caching,
            enable_sleep_mode=rollout.sleep_level > 0 and not self.on_cpu,
            **sizing,
            **extension,
            **CheckpointLayout.of(model_path).engine_kwargs(on_gpu=not self.on_cpu),
        )
        engine = LLMEngine.from_engine_args(args)
        self.tokenizer = engine.get_tokenizer()
        self.loop = EngineLoop(engine)
        self.policy = Policy(self.loop, rollout, model_path)
        self._lora_ids = itertools.count(1)
        self._weights: str | dict = model_path  # what a level-2 wake must reload: a folder or tensors
        self._base_weights: dict | None = None  # the folder's tensors, kept for sync.strategy=merged_on_engine
        self._local_adapter: str | None = None  # node-local folder of the adapter installed from memory
        self._asleep = False
        self._server = None

    # --- sampling -------------------------------------------------------------------
    @property
    def lora_request(self):
        """The active adapter, used by every later request (None: base weights)."""
        return self.policy.adapter

    def max_tokens_for(self, prompt_len: int, requested: int | None) -> int:
        return self.policy.clamp_max_tokens(prompt_len, requested)

    def generate(self, prompts: list[list[int]], n: int, max_tokens: int | None = None) -> list[list[Completion]]:
        """n samples per prompt, all submitted at once so the engine batches them."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        jobs = []
        for prompt in prompts:
            if not prompt:
                raise ValueError("generate() got an empty prompt")
            params = self.policy.sampling_params(self.max_tokens_for(len(prompt), max_tokens))
            jobs.append([self.policy.submit(list(prompt), params)[1] for _ in range(n)])
        return [[collect_completion(prompt, stream) for stream in streams] for prompt, streams in zip(prompts, jobs)]

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token_i | prefix) under the served policy (active LoRA included); 0.0 at index 0."""
        if len(token_ids) > self.cfg.max_model_len - 1:
            raise ValueError(f"prompt_logprobs: {len(token_ids)} tokens do not fit "
                             f"rollout.max_model_len={self.cfg.max_model_len} (needs one slot to generate)")
        stream = self.policy.score(token_ids)
        final = None
        while (item := stream.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            final = item
        return scored_logprobs(final, token_ids)

    # --- weight sync ----------------------------------------------------------------
    def load_lora_adapter(self, path: str) -> None:
        """Hot-load a PEFT adapter folder; a fresh id per call so no cached copy can be served."""
        if not self.enable_lora:
            raise RuntimeError("load_lora_adapter: this worker was built with enable_lora=False "
                               "(sync.strategy=merged); use reload_weights instead")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise FileNotFoundError(f"load_lora_adapter: {path!r} has no adapter_config.json (not a PEFT adapter folder)")
        from vllm.lora.request import LoRARequest
        lora_id = next(self._lora_ids)
        new = LoRARequest(lora_name=f"policy-{lora_id}", lora_int_id=lora_id, lora_path=path)
        old = self.lora_request

        def swap(engine):
            engine.add_lora(new)  # loads now: a broken adapter fails here, not in a later request
            if old is not None:
                engine.remove_lora(old.lora_int_id)

        self.loop.call(swap)
        self.policy.adapter = new
        log.info("LoRA adapter %s active (id %d)", path, new.lora_int_id)

    def reload_weights(self, path: str) -> None:
        """Load merged HF safetensors in place; drops the LoRA and the now-stale prefix cache."""
        if not os.path.isdir(path):
            raise FileNotFoundError(f"reload_weights: {path!r} is not a folder of safetensors")
        self._reload({"weights_path": path}, path)

    def _reload(self, source: dict, weights) -> None:
        """Load merged weights in place (from a folder or from memory), drop any adapter and
        the prefix cache (its entries belong to the old weights)."""
        old = self.lora_request

        def reload(engine):
            engine.collective_rpc("reload_weights", kwargs=source)
            engine.reset_prefix_cache()
            if old is not None:
                engine.remove_lora(old.lora_int_id)

        self.loop.call(reload)
        self.policy.adapter = None
        self._weights = weights

    def install_lora(self, files: dict[str, bytes]) -> None:
        """Install an adapter sent as a value (Learner.adapter_files): written to a folder on
        this node, hot-loaded, and the previous such folder removed."""
        path = str(write_folder(files, tempfile.mkdtemp(prefix="rlvr-lora-")))
        try:
            self.load_lora_adapter(path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        old, self._local_adapter = self._local_adapter, path
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def install_weights(self, tensors: dict) -> None:
        """Load merged weights sent as tensors (Learner.merged_weights) in place, from memory."""
        if not tensors:
            raise ValueError("install_weights: got no tensors")
        self._reload({"weights_iterator": iter(tensors.items())}, tensors)

    def install_lora_merged(self, factors: dict) -> None:
        """Fold LoRA factors (Learner.lora_factors) into the base weights here and load the result in
        place: the merged model of sync.strategy=merged without shipping it. The base weights are
        read from the model folder once and kept in host memory (the model's size)."""

        if not factors:
            raise ValueError("install_lora_merged: got no LoRA factors")
        if self._base_weights is None:
            self._base_weights = read_safetensors(self.model_path)
        unknown = sorted(set(factors) - set(self._base_weights))
        if unknown:
            raise KeyError(f"LoRA factors for weights the model folder does not have: {unknown[:3]}")
        merged = dict(self._base_weights)
        for key, (a, b, scale) in factors.items():  # in fp32, stored in the folder's dtype
            base = self._base_weights[key]
            merged[key] = (base.float() + (b.float() @ a.float()) * scale).to(base.dtype)
        self._reload({"weights_iterator": iter(merged.items())}, merged)

    def gpu_uuid(self) -> str:
        from actors.sync_cuda_ipc import device_uuid
        return device_uuid()

    def install_ipc_bucket(self, payload: bytes) -> int:
        """Load one bucket of merged weights from the learner's GPU memory (actors.sync_cuda_ipc);
        returns how many tensors it held."""
        return sum(self.loop.call(lambda e: e.collective_rpc("load_ipc_bucket", args=(payload,))))

    def finish_ipc_sync(self, *released) -> None:
        """After the last bucket: the prefix cache belongs to the old weights, and no adapter applies."""
        old = self.lora_request

        def finish(engine):
            engine.reset_prefix_cache()
            if old is not None:
                engine.remove_lora(old.lora_int_id)

        self.loop.call(finish)
        self.policy.adapter = None

    # --- sleep / wake ---------------------------------------------------------------
    def sleep(self) -> None:
        if self.cfg.sleep_level == 0 or self.on_cpu:
            log.info("sleep: no-op (%s)", "CPU platform" if self.on_cpu else "rollout.sleep_level=0")
            return
        self.loop.call(lambda e: e.sleep(level=self.cfg.sleep_level))
        self._asleep = True

    def wake(self) -> None:
        """Level 1: everything back as it was. Level 2 discarded the weights: in vLLM's documented
        order, the weights' memory comes back first, the served weights are reloaded into it, and
        only then the KV cache (so the reload's per-layer buffers never sit beside it, and the
        scheduler, which resumes once every tag is awake, never runs on unloaded weights)."""
        if not self._asleep:
            log.info("wake: no-op (engine was not asleep)")
            return
        t0 = time.perf_counter()
        if self.cfg.sleep_level == 2:
            source = self._weights
            kwargs = ({"weights_path": source} if isinstance(source, str)
                      else {"weights_iterator": iter(source.items())})
            self.loop.call(lambda e: e.wake_up(tags=["weights"]))
            t1 = time.perf_counter()
            self.loop.call(lambda e: e.collective_rpc("reload_weights", kwargs=kwargs))
            t2 = time.perf_counter()
            self.loop.call(lambda e: e.wake_up(tags=["kv_cache"]))
            log.info("wake (level 2): weights' memory %.2fs, reload %.2fs (%s), KV cache %.2fs", t1 - t0, t2 - t1,
                     source if isinstance(source, str) else f"{len(source)} tensors from memory",
                     time.perf_counter() - t2)
        else:
            self.loop.call(lambda e: e.wake_up())
            log.info("wake (level %d): %.2fs", self.cfg.sleep_level, time.perf_counter() - t0)
        self.loop.call(lambda e: e.reset_prefix_cache())
        self._asleep = False

    def device_memory_gib(self) -> float | None:
        """Memory in use on this worker's GPU by every process (engine and a co-located learner
        alike); None on CPU. The loop's memory timeline reads it around sleep and wake."""
        if self.on_cpu:
            return None
        import torch
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**30

    # --- policy server --------------------------------------------------------------
    def start_server(self, spans_nodes: bool = False) -> str:
        """Start the OpenAI-compatible server (idempotent); episodes use f"{base}/episodes/{id}/v1".

        rollout.server_host=auto binds loopback, or this node's address when the run spans
        nodes (environment actors elsewhere must reach it); never all interfaces."""
        if self._server is None:
            # FastAPI + vLLM's protocol: only where served
            from actors.http_thread import bind_address
            from actors.policy_server import PolicyServer
            cfg = self.cfg.model_copy(update={"server_host": bind_address(self.cfg.server_host, spans_nodes)})
            self._server = PolicyServer(self.policy, self.tokenizer, cfg, self.model_cfg)
            self._server.start()
        return self._server.base_url

    def script_episode(self, episode_id: str, messages: list[dict]) -> None:
        """Answer the episode's first calls with these assistant messages (a rescue prefix)."""
        if self._server is None:
            raise RuntimeError("script_episode: start_server() was never called on this worker")
        self._server.recorder.script(episode_id, messages)

    def take_episode_calls(self, episode_id: str) -> list[CallRecord]:
        if self._server is None:
            raise RuntimeError("take_episode_calls: start_server() was never called on this worker")
        return self._server.recorder.take(episode_id)

    def chat_template_info(self) -> dict:
        return {"tokenizer": self.model_path, "tool_call_parser": self.model_cfg.tool_call_parser,
                "eos_token_id": self.tokenizer.eos_token_id, "max_model_len": self.cfg.max_model_len}

    def shutdown(self) -> None:
        """Stop server and engine and release vLLM's process-global state, so a later
        engine in the same process starts clean (an in-process engine shares it)."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.loop.stop()
        self.loop.engine.engine_core.shutdown()
        self.loop.engine = None
        if self._local_adapter is not None:
            shutil.rmtree(self._local_adapter, ignore_errors=True)
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        cleanup_dist_env_and_memory()
