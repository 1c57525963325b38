"""RolloutWorker: one vLLM engine, the policy server in front of it, and the weight-sync target.

The engine runs in-process and is stepped by a single thread (`EngineLoop`), so batch
`generate()` calls from the driver and chat requests from many episodes share one
continuous batch, and weight/LoRA changes happen between steps, never during one.
"""
from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl.config import ModelConfig, RolloutConfig
from rl.types import CallRecord, Completion

log = logging.getLogger("rlvr.rollout")


def _configure_env(rollout: RolloutConfig) -> None:
    """vLLM reads these at import/engine start; set them before either happens."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(rollout.cpu_kvcache_gib))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, int(rollout.num_cpus))))
    if rollout.num_gpus == 0:
        # In-process engine core: no second process competing for the CPU cores.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class RequestStream:
    """Outputs of one engine request, delivered to a thread or to an asyncio loop."""

    def __init__(self, loop=None) -> None:
        self._loop = loop
        if loop is None:
            self._queue: Any = queue.SimpleQueue()
        else:
            import asyncio
            self._queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        if self._loop is None:
            self._queue.put(item)
        else:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def get(self) -> Any:
        return self._queue.get()

    async def aget(self) -> Any:
        return await self._queue.get()


def _deliver(pairs: list[tuple[Any, Any]]) -> None:
    for q, item in pairs:
        q.put_nowait(item)


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    done: threading.Event
    result: Any = None
    error: BaseException | None = None


class EngineLoop:
    """Owns the engine thread: adds requests, steps, routes outputs, runs engine calls."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._thread = threading.Thread(target=self._run, name="vllm-engine-loop", daemon=True)
        self._stopped = False
        self._thread.start()

    def submit(self, prompt_ids: list[int], params, lora_request=None, loop=None) -> tuple[str, RequestStream]:
        """Queue one request; the stream yields RequestOutputs, then None when finished."""
        request_id = uuid.uuid4().hex
        stream = RequestStream(loop)
        self._commands.put(("add", request_id, prompt_ids, params, lora_request, stream))
        return request_id, stream

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(engine) on the engine thread between steps and return its result."""
        c = _Call(fn, threading.Event())
        self._commands.put(("call", c))
        c.done.wait()
        if c.error is not None:
            raise c.error
        return c.result

    def stop(self) -> None:
        self._stopped = True
        self._commands.put(("stop",))
        self._thread.join(timeout=10)

    def _handle(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            _, request_id, prompt_ids, params, lora_request, stream = cmd
            try:
                self.engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params,
                                        lora_request=lora_request)
            except Exception as e:  # a bad request fails its caller, not the loop
                stream.put(e)
                return
            self._streams[request_id] = stream
        elif kind == "abort":
            stream = self._streams.pop(cmd[1], None)
            if stream is not None:
                self.engine.abort_request([cmd[1]])
                stream.put(None)
        elif kind == "call":
            c: _Call = cmd[1]
            try:
                c.result = c.fn(self.engine)
            except BaseException as e:
                c.error = e
            c.done.set()

    def _run(self) -> None:
        while not self._stopped:
            if not self._streams:
                cmd = self._commands.get()  # idle: block until there is work
                if cmd[0] == "stop":
                    break
                self._handle(cmd)
            while True:
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    break
                if cmd[0] == "stop":
                    self._stopped = True
                    break
                self._handle(cmd)
            if self._stopped or not self._streams:
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:
                log.exception("engine step failed; failing all in-flight requests")
                for stream in self._streams.values():
                    stream.put(e)
                self._streams.clear()
                continue
            # One wake-up per event loop per step, however many of its requests advanced.
            batched: dict[Any, list[tuple[Any, Any]]] = {}
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue
                items = [out]
                if out.finished:
                    del self._streams[out.request_id]
                    items.append(None)
                if stream._loop is None:
                    for item in items:
                        stream.put(item)
                else:
                    batched.setdefault(stream._loop, []).extend((stream._queue, item) for item in items)
            for loop, pairs in batched.items():
                loop.call_soon_threadsafe(_deliver, pairs)
        for stream in self._streams.values():
            stream.put(RuntimeError("engine loop stopped"))


def _engine_dtype(model: ModelConfig, on_cpu: bool) -> str:
    if model.dtype != "auto":
        return model.dtype
    return "float32" if on_cpu else "bfloat16"


class RolloutWorker:
    """Ray actor body (plain class): the driver wraps it with ray.remote(...).options(...)."""

    def __init__(self, model_path: str, rollout: RolloutConfig, model: ModelConfig,
                 enable_lora: bool = True, max_lora_rank: int = 16) -> None:
        _configure_env(rollout)
        from vllm import EngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine

        self.cfg = rollout
        self.model_cfg = model
        self.model_path = model_path
        self.tokenizer_name_or_path = model_path
        self.on_cpu = current_platform.is_cpu()
        self.enable_lora = enable_lora
        args = EngineArgs(
            model=model_path,
            dtype=_engine_dtype(model, self.on_cpu),
            max_model_len=rollout.max_model_len,
            enforce_eager=rollout.enforce_eager,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            enable_lora=enable_lora,
            max_lora_rank=max_lora_rank,
            max_loras=1,
            seed=rollout.seed,
            max_num_seqs=rollout.max_num_seqs,
            enable_prefix_caching=rollout.enable_prefix_caching,
            enable_sleep_mode=rollout.sleep_level > 0 and not self.on_cpu,
        )
        engine = LLMEngine.from_engine_args(args)
        self.tokenizer = engine.get_tokenizer()
        self.loop = EngineLoop(engine)
        self._lora_ids = itertools.count(1)
        self.lora_request = None  # active adapter, used by every later request
        self._weights_path = model_path  # what a level-2 wake must reload
        self._asleep = False
        self._server = None

    # --- sampling -------------------------------------------------------------------
    def sampling_params(self, max_tokens: int, **overrides):
        """The run's sampling settings; per-token logprobs of the sampled tokens always on."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        kw = dict(n=1, temperature=self.cfg.temperature, top_p=self.cfg.top_p, max_tokens=max_tokens,
                  logprobs=0, output_kind=RequestOutputKind.DELTA)
        kw.update(overrides)
        return SamplingParams(**kw)

    def max_tokens_for(self, prompt_len: int, requested: int | None) -> int:
        """Clamp to the config cap and to the context left (never reject for length)."""
        left = self.cfg.max_model_len - prompt_len
        if left < 1:
            raise ValueError(f"prompt is {prompt_len} tokens; rollout.max_model_len={self.cfg.max_model_len} "
                             f"leaves no room to generate; shorten the prompt or raise rollout.max_model_len")
        cap = self.cfg.max_tokens if requested is None else min(requested, self.cfg.max_tokens)
        return max(1, min(cap, left))

    def generate(self, prompts: list[list[int]], n: int, max_tokens: int | None = None) -> list[list[Completion]]:
        """n samples per prompt, all submitted at once so the engine batches them."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        jobs = []
        for prompt in prompts:
            if not prompt:
                raise ValueError("generate() got an empty prompt")
            params = self.sampling_params(self.max_tokens_for(len(prompt), max_tokens))
            jobs.append([self.loop.submit(list(prompt), params, self.lora_request)[1] for _ in range(n)])
        return [[collect_completion(prompt, stream) for stream in streams] for prompt, streams in zip(prompts, jobs)]

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token_i | prefix) under the served policy (active LoRA included); 0.0 at index 0."""
        if len(token_ids) > self.cfg.max_model_len - 1:
            raise ValueError(f"prompt_logprobs: {len(token_ids)} tokens do not fit "
                             f"rollout.max_model_len={self.cfg.max_model_len} (needs one slot to generate)")
        _, stream = self.loop.submit(list(token_ids), self.scoring_params(), self.lora_request)
        final = None
        while (item := stream.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            final = item
        return scored_logprobs(final, token_ids)

    def scoring_params(self):
        """One-token request that returns the prompt's own log-probs (raw, unconstrained)."""
        from vllm.sampling_params import RequestOutputKind
        return self.sampling_params(1, prompt_logprobs=0, logprobs=None, output_kind=RequestOutputKind.FINAL_ONLY)

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
        self.lora_request = new
        log.info("LoRA adapter %s active (id %d)", path, new.lora_int_id)

    def reload_weights(self, path: str) -> None:
        """Load merged HF safetensors in place; drops the LoRA and the now-stale prefix cache."""
        if not os.path.isdir(path):
            raise FileNotFoundError(f"reload_weights: {path!r} is not a folder of safetensors")
        old = self.lora_request

        def reload(engine):
            engine.collective_rpc("reload_weights", kwargs={"weights_path": path})
            engine.reset_prefix_cache()
            if old is not None:
                engine.remove_lora(old.lora_int_id)

        self.loop.call(reload)
        self.lora_request = None
        self._weights_path = path

    # --- sleep / wake ---------------------------------------------------------------
    def sleep(self) -> None:
        if self.cfg.sleep_level == 0 or self.on_cpu:
            log.info("sleep: no-op (%s)", "CPU platform" if self.on_cpu else "rollout.sleep_level=0")
            return
        self.loop.call(lambda e: e.sleep(level=self.cfg.sleep_level))
        self._asleep = True

    def wake(self) -> None:
        if not self._asleep:
            log.info("wake: no-op (engine was not asleep)")
            return
        self.loop.call(lambda e: e.wake_up())
        if self.cfg.sleep_level == 2:  # level 2 discards the weights: put the served ones back
            path = self._weights_path
            self.loop.call(lambda e: e.collective_rpc("reload_weights", kwargs={"weights_path": path}))
        self.loop.call(lambda e: e.reset_prefix_cache())
        self._asleep = False

    # --- policy server --------------------------------------------------------------
    def start_server(self) -> str:
        """Start the OpenAI-compatible server (idempotent); episodes use f"{base}/episodes/{id}/v1"."""
        if self._server is None:
            from actors.policy_server import PolicyServer
            self._server = PolicyServer(self, self.cfg, self.model_cfg)
            self._server.start()
        return self._server.base_url

    def take_episode_calls(self, episode_id: str) -> list[CallRecord]:
        if self._server is None:
            raise RuntimeError("take_episode_calls: start_server() was never called on this worker")
        return self._server.recorder.take(episode_id)

    def chat_template_info(self) -> dict:
        return {"tokenizer": self.tokenizer_name_or_path, "tool_call_parser": self.model_cfg.tool_call_parser,
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
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        cleanup_dist_env_and_memory()


def collect_completion(prompt: list[int], stream: RequestStream) -> Completion:
    """Accumulate one request's delta outputs into a Completion."""
    token_ids: list[int] = []
    logprobs: list[float] = []
    text: list[str] = []
    finish = "abort"
    while (item := stream.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        out = item.outputs[0]
        token_ids.extend(out.token_ids)
        logprobs.extend(sampled_logprobs(out))
        text.append(out.text)
        if out.finish_reason is not None:
            finish = out.finish_reason
    return Completion(prompt_token_ids=list(prompt), token_ids=token_ids, logprobs=logprobs,
                      text="".join(text), finish_reason=finish)


def scored_logprobs(final, token_ids: list[int]) -> list[float]:
    """Per-token prompt log-probs of a scoring request's final output; 0.0 at index 0."""
    return [0.0] + [float(entry[tok].logprob) for tok, entry in zip(token_ids[1:], final.prompt_logprobs[1:])]


def sampled_logprobs(out) -> list[float]:
    """The sampled token's log-prob at each position of a (delta) CompletionOutput."""
    if out.logprobs is None:
        raise RuntimeError("engine returned no logprobs; the request must set logprobs=0")
    return [float(pos[tok].logprob) for tok, pos in zip(out.token_ids, out.logprobs)]
