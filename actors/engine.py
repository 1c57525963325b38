"""The vLLM engine loop and the policy facade the rollout worker and its server share.

The engine runs in-process and is stepped by a single thread (`EngineLoop`), so batch
`generate()` calls from the driver and chat requests from many episodes share one
continuous batch, and weight/LoRA changes happen between steps, never during one.
`Policy` is the small interface the policy server uses: submit, score and abort under the
active adapter, the run's sampling, and the max-tokens clamp; it never sees the worker.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl.config import RolloutConfig
from rl.paths import vllm_cache_dir
from rl.types import Completion

log = logging.getLogger("rlvr.engine")


def configure_engine_env(rollout: RolloutConfig) -> None:
    """vLLM reads these at import/engine start; set them before either happens."""
    for key, value in engine_env_vars(rollout, max(1, int(rollout.num_cpus))).items():
        os.environ.setdefault(key, value)
    cache = os.environ.get("VLLM_CACHE_ROOT")
    if cache:
        try:
            os.makedirs(cache, exist_ok=True)
        except OSError as e:  # RLVR_HOME not writable here: vLLM's own default (~/.cache/vllm) instead
            log.warning("compile cache %s not writable (%s); vLLM uses its default", cache, e)
            del os.environ["VLLM_CACHE_ROOT"]


def engine_env_vars(rollout: RolloutConfig, threads: int) -> dict[str, str]:
    """vLLM's CPU knobs and the thread count, for this process or an actor's runtime env."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(rollout.cpu_kvcache_gib), "OMP_NUM_THREADS": str(threads),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if rollout.engine_core == "own_process" else "0"}
    if rollout.num_gpus > 0:
        # CUDA graphs compile once per model shape (minutes for a 4B hybrid): keep the result for the next start
        env["VLLM_CACHE_ROOT"] = os.environ.get("VLLM_CACHE_ROOT") or str(vllm_cache_dir())
    return env


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

    @staticmethod
    def deliver_many(pairs: list[tuple["RequestStream", Any]]) -> None:
        """Deliver items to many streams with one wake-up per asyncio loop (not one per item)."""
        by_loop: dict[Any, list[tuple[Any, Any]]] = {}
        for stream, item in pairs:
            if stream._loop is None:
                stream._queue.put(item)
            else:
                by_loop.setdefault(stream._loop, []).append((stream._queue, item))
        for loop, queued in by_loop.items():
            loop.call_soon_threadsafe(_put_all, queued)


def _put_all(pairs: list[tuple[Any, Any]]) -> None:
    for q, item in pairs:
        q.put_nowait(item)


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    done: threading.Event
    result: Any = None
    error: BaseException | None = None


class EngineLoop:
    """Owns the engine thread: adds requests, steps, routes outputs, runs engine calls.

    Example:
        loop = EngineLoop(LLMEngine.from_engine_args(args))
        _, stream = loop.submit(prompt_ids, params)       # from any thread
        completion = collect_completion(prompt_ids, stream)
        loop.call(lambda engine: engine.reset_prefix_cache())  # between two steps
    """

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
            pairs: list[tuple[RequestStream, Any]] = []
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue
                pairs.append((stream, out))
                if out.finished:
                    del self._streams[out.request_id]
                    pairs.append((stream, None))
            RequestStream.deliver_many(pairs)
        for stream in self._streams.values():
            stream.put(RuntimeError("engine loop stopped"))


class Policy:
    """The served policy, as the policy server and `generate()` see it.

    Every request goes out under the active LoRA adapter (`adapter`, swapped by the worker
    between engine steps) with the run's sampling settings.
    """

    def __init__(self, loop: EngineLoop, rollout: RolloutConfig, model_name: str) -> None:
        self.loop = loop
        self.cfg = rollout
        self.model_name = model_name
        self.adapter = None  # the active vLLM LoRARequest, or None for the base weights

    def submit(self, prompt_ids: list[int], params, loop=None) -> tuple[str, RequestStream]:
        return self.loop.submit(prompt_ids, params, self.adapter, loop=loop)

    def abort(self, request_id: str) -> None:
        self.loop.abort(request_id)

    def sampling_params(self, max_tokens: int, **overrides):
        """The run's sampling settings; per-token logprobs of the sampled tokens always on
        (rollout.ignore_eos: the completion runs on past its end tokens to max_tokens)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        kw = dict(n=1, temperature=self.cfg.temperature, top_p=self.cfg.top_p, max_tokens=max_tokens,
                  logprobs=0, output_kind=RequestOutputKind.DELTA, ignore_eos=self.cfg.ignore_eos)
        kw.update(overrides)
        return SamplingParams(**kw)

    def scoring_params(self):
        """One-token request that returns the prompt's own log-probs (raw, unconstrained)."""
        from vllm.sampling_params import RequestOutputKind
        return self.sampling_params(1, prompt_logprobs=0, logprobs=None, output_kind=RequestOutputKind.FINAL_ONLY)

    def score(self, token_ids: list[int], loop=None) -> RequestStream:
        """Submit a scoring request; its final output holds the prompt log-probs (`scored_logprobs`)."""
        return self.submit(list(token_ids), self.scoring_params(), loop=loop)[1]

    def clamp_max_tokens(self, prompt_len: int, requested: int | None) -> int:
        """Clamp to the config cap and to the context left (never reject for length)."""
        left = self.cfg.max_model_len - prompt_len
        if left < 1:
            raise ValueError(f"prompt is {prompt_len} tokens; rollout.max_model_len={self.cfg.max_model_len} "
                             f"leaves no room to generate; shorten the prompt or raise rollout.max_model_len")
        cap = self.cfg.max_tokens if requested is None else min(requested, self.cfg.max_tokens)
        return max(1, min(cap, left))


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
