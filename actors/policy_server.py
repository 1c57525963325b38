"""OpenAI-compatible chat server over the served `Policy` (actors/engine.py), recording every call.

Any OpenAI client (pi included) is pointed at one episode by its base URL,
`{base}/episodes/<episode_id>/v1`. For each choice served the recorder keeps the prompt
token ids the engine consumed and the completion ids and sampled log-probs exactly as
generated, so training never re-tokenizes text. Sampling comes from the run's config, not
the client; `max_tokens` is clamped to the context left instead of being rejected.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

# This module path holds every protocol type on vLLM 0.26 (GPU) and 0.32 (CPU) alike.
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
    FunctionCall,
    ToolCall,
    UsageInfo,
)
from vllm.sampling_params import RequestOutputKind

try:
    from vllm.exceptions import VLLMClientError  # 0.32; on 0.26 vLLM's request checks raise ValueError
except ImportError:
    VLLMClientError = ValueError

from actors.chat_format import assistant_text, continuation_ids, render_prompt
from actors.engine import Policy, sampled_logprobs, scored_logprobs
from actors.http_thread import ThreadedServer
from actors.tool_parsers import ToolCallFormat, unparsed
from rl.config import ModelConfig, RolloutConfig
from rl.types import LEARNER_LOGPROB, CallRecord

log = logging.getLogger("rlvr.policy_server")


class CallRecorder:
    """Per-episode call log, shared by the server thread and the actor's method calls.

    It also remembers each episode's last single-choice call (prompt + completion ids), so
    the next prompt can reuse those exact tokens (see `PolicyServer.continuation_ids`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, list[CallRecord]] = {}
        self._last: dict[str, list[int]] = {}
        self._scripts: dict[str, list[dict]] = {}   # episode -> the rescue prefix's turns not yet served

    def script(self, episode_id: str, messages: list[dict]) -> None:
        """The episode's first len(messages) calls are answered with these assistant messages."""
        with self._lock:
            self._scripts[episode_id] = list(messages)

    def next_scripted(self, episode_id: str) -> dict | None:
        with self._lock:
            pending = self._scripts.get(episode_id)
            return pending.pop(0) if pending else None

    def add(self, episode_id: str, records: list[CallRecord]) -> None:
        with self._lock:
            self._calls.setdefault(episode_id, []).extend(records)
            if len(records) == 1:
                self._last[episode_id] = records[0].prompt_token_ids + records[0].completion_token_ids
            else:
                self._last.pop(episode_id, None)

    def last_sequence(self, episode_id: str) -> list[int] | None:
        with self._lock:
            return self._last.get(episode_id)

    def take(self, episode_id: str) -> list[CallRecord]:
        with self._lock:
            self._last.pop(episode_id, None)
            self._scripts.pop(episode_id, None)
            return self._calls.pop(episode_id, [])


class BadRequest(ValueError):
    """The client's request cannot be served; the message says why."""


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


@dataclass
class _Choice:
    """One sampled choice while it streams: what was generated and what was sent."""
    index: int
    request_id: str
    stream: Any
    parser: Any
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    tools_streamed: bool = False
    last: Any = None               # the latest engine output: request timestamps, cached tokens
    rescore_s: float = 0.0


class PolicyServer:
    def __init__(self, policy: Policy, tokenizer, rollout: RolloutConfig, model: ModelConfig) -> None:
        self.policy = policy
        self.cfg = rollout
        self.tokenizer = tokenizer
        self.format = ToolCallFormat(self.tokenizer, model.tool_call_parser, rollout.tool_strict_level)
        self.recorder = CallRecorder()
        self.app = self._build_app()
        self.base_url = ""
        self._http: ThreadedServer | None = None

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self._http = ThreadedServer(self.app, self.cfg.server_host, self.cfg.server_port, name="policy server")
        self.base_url = f"http://{_advertised_host(self.cfg.server_host)}:{self._http.port}"
        log.info("policy server at %s (episodes: %s/episodes/<id>/v1)", self.base_url, self.base_url)

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()

    # --- HTTP -----------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        app = FastAPI(title="agentic-rlvr policy server")

        @app.get("/health")
        async def health() -> dict:
            return {"ok": True}

        @app.get("/episodes/{episode_id}/v1/models")
        async def models(episode_id: str) -> dict:
            return {"object": "list", "data": [{"id": self.policy.model_name, "object": "model",
                                                "owned_by": "agentic-rlvr"}]}

        @app.post("/episodes/{episode_id}/v1/chat/completions")
        async def chat(episode_id: str, raw: Request):
            try:
                body = await raw.json()
            except json.JSONDecodeError as e:
                return _error(400, f"request body is not JSON: {e}")
            try:
                request, prompt_ids, params, n = self.prepare(body, episode_id)
            except BadRequest as e:
                return _error(400, str(e))
            scripted = self.recorder.next_scripted(episode_id)
            if scripted is not None:
                return self._scripted(episode_id, body, request, prompt_ids, scripted)
            if request.stream:
                return StreamingResponse(self._stream(episode_id, request, prompt_ids, params, n),
                                         media_type="text/event-stream")
            return await self._complete(episode_id, request, prompt_ids, params, n)

        return app

    def prepare(self, body: Any, episode_id: str | None = None) -> tuple[ChatCompletionRequest, list[int], Any, int]:
        """Validate, apply the run's sampling, render the prompt, build SamplingParams."""
        if not isinstance(body, dict):
            raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
        body = dict(body)
        n = body.pop("n", None) or 1
        if not isinstance(n, int) or n < 1:
            raise BadRequest(f"n must be a positive integer, got {n!r}")
        # The run's sampling overrides the client's; per-token logprobs are always recorded.
        body.update(temperature=self.cfg.temperature, top_p=self.cfg.top_p, seed=None,
                    logprobs=True, top_logprobs=0)
        if self.cfg.tool_choice != "client" and body.get("tools"):
            body["tool_choice"] = self.cfg.tool_choice
        try:
            request = ChatCompletionRequest.model_validate(body)
            request = self.format.adjust(request)
        except ValidationError as e:
            raise BadRequest(_validation_message(e)) from None
        except (ValueError, VLLMClientError) as e:  # vLLM's checks, e.g. a named tool not in `tools`
            raise BadRequest(str(e)) from None
        try:
            text = render_prompt(self.tokenizer, request)
        except Exception as e:  # template errors are the client's messages' fault
            raise BadRequest(f"chat template could not render the messages: {type(e).__name__}: {e}") from None
        prompt_ids = self.continuation_ids(episode_id, text)
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        try:
            max_tokens = self.policy.clamp_max_tokens(len(prompt_ids), requested)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        params = request.to_sampling_params(max_tokens, {})
        params.output_kind = RequestOutputKind.DELTA
        return request, prompt_ids, params, n

    def _scripted(self, episode_id: str, body: dict, request: ChatCompletionRequest, prompt_ids: list[int],
                  message: dict):
        """A rescue prefix's turn: the demonstration's assistant message instead of a sample.

        It is recorded as the tokens the model emits for that message in the serving format
        (`scripted`: the assembled sequence keeps them, with loss mask 0) and sent as if
        generated, so the client runs its tool calls for real and the next prompt, which
        holds them, continues these tokens verbatim."""
        t0 = time.time()
        messages = [*body["messages"], message]
        _, text = assistant_text(self.tokenizer, messages, body.get("tools"), len(messages) - 1)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        tool_calls = [dict(tc) for tc in message.get("tool_calls") or []]
        finish = "tool_calls" if tool_calls else "stop"
        content = message.get("content") or ""
        self.recorder.add(episode_id, [CallRecord(
            prompt_token_ids=list(prompt_ids), completion_token_ids=ids, logprobs=[0.0] * len(ids),
            finish_reason=finish, content=content, tool_calls=tool_calls, seconds=time.time() - t0, scripted=True)])
        model = request.model or self.policy.model_name
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(prompt_ids) + len(ids)}
        if not request.stream:
            return JSONResponse({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                                 "created": int(t0), "model": model, "usage": usage,
                                 "choices": [{"index": 0, "finish_reason": finish, "message": {
                                     "role": "assistant", "content": content, "tool_calls": tool_calls}}]})

        def chunk(delta: dict, finish_reason: str | None = None, **extra) -> str:
            return "data: " + json.dumps({"id": f"chatcmpl-{episode_id}", "object": "chat.completion.chunk",
                                          "created": int(t0), "model": model, **extra, "choices": [
                                              {"index": 0, "delta": delta, "finish_reason": finish_reason}]}) + "\n\n"

        calls = [{"index": i, **tc} for i, tc in enumerate(tool_calls)]
        parts = [chunk({"role": "assistant", "content": ""}), chunk({"content": content} if content else {}),
                 *([chunk({"tool_calls": calls})] if calls else []), chunk({}, finish)]
        if request.stream_options is not None and request.stream_options.include_usage:
            parts.append("data: " + json.dumps({"id": f"chatcmpl-{episode_id}", "object": "chat.completion.chunk",
                                                "model": model, "choices": [], "usage": usage}) + "\n\n")
        parts.append("data: [DONE]\n\n")

        async def stream():
            for part in parts:
                yield part

        return StreamingResponse(stream(), media_type="text/event-stream")

    def continuation_ids(self, episode_id: str | None, text: str) -> list[int]:
        """Token ids for a rendered prompt, reusing the episode's previous call verbatim
        (actors.chat_format.continuation_ids: consecutive calls then merge into one sequence)."""
        prev = self.recorder.last_sequence(episode_id) if episode_id else None
        return continuation_ids(self.tokenizer, prev, text)

    def _submit(self, request: ChatCompletionRequest, prompt_ids: list[int], params, n: int) -> list[_Choice]:
        loop = asyncio.get_running_loop()
        choices = []
        for i in range(n):
            request_id, stream = self.policy.submit(prompt_ids, params, loop=loop)
            choices.append(_Choice(i, request_id, stream, self.format.parser(request)))
        return choices

    @staticmethod
    def _absorb(choice: _Choice, out) -> Any:
        o = out.outputs[0]
        choice.token_ids.extend(o.token_ids)
        choice.logprobs.extend(sampled_logprobs(o))
        choice.text.append(o.text)
        choice.last = out
        if o.finish_reason is not None:
            choice.finish_reason = o.finish_reason
        return o

    def _records(self, request: ChatCompletionRequest, prompt_ids: list[int], choices: list[_Choice],
                 seconds: float) -> tuple[list[CallRecord], list[tuple[str | None, list[dict], str]]]:
        records, parsed = [], []
        for c in choices:
            text = "".join(c.text)
            content, tool_calls = self.format.parse(request, text, c.token_ids)
            finish = _finish_reason(request, c.finish_reason or "abort", bool(tool_calls))
            parsed.append((content, tool_calls, finish))
            records.append(CallRecord(prompt_token_ids=list(prompt_ids), completion_token_ids=c.token_ids,
                                       logprobs=c.logprobs, finish_reason=finish, content=content or "",
                                       tool_calls=tool_calls, seconds=seconds, rescore_s=c.rescore_s,
                                       unparsed_tool_call=unparsed(text, tool_calls), **engine_timing(c.last)))
        return records, parsed

    async def _unconstrained_logprobs(self, prompt_ids: list[int], choice: _Choice) -> None:
        """Replace a guided choice's logprobs with the policy's own (grammar mask not applied).

        Under guided decoding the engine reports log-probs of the masked distribution (a
        forced token scores 0.0), while the learner scores the plain policy; the importance
        ratio needs both sides computed the same way, so the served policy re-scores the
        sampled tokens once, in the same batch loop.
        """
        ids = prompt_ids + choice.token_ids
        # A scoring request needs one free slot; a call that filled the context keeps the
        # engine's value for its very last token.
        fit = ids[:self.cfg.max_model_len - 1]
        stream = self.policy.score(fit, loop=asyncio.get_running_loop())
        final = None
        while (item := await stream.aget()) is not None:
            if isinstance(item, BaseException):
                raise item
            final = item
        rescored = scored_logprobs(final, fit)[len(prompt_ids):]
        choice.logprobs = rescored + choice.logprobs[len(rescored):]

    async def _finish(self, episode_id: str, request, prompt_ids, params, choices, t0: float):
        """Record a completed call and return the parsed choices.

        Guided output's log-probs are the masked distribution's: they are either re-scored
        here (`rollout.guided_logprobs: rescore`, a second uncached prefill of the whole
        sequence per call) or marked LEARNER_LOGPROB, and the learner, which computes the
        plain policy's log-probs of these tokens in its update anyway, uses its own.
        """
        if params.structured_outputs is not None:
            for c in choices:
                if not c.token_ids:
                    continue
                if self.cfg.guided_logprobs == "rescore":
                    start = time.perf_counter()
                    await self._unconstrained_logprobs(prompt_ids, c)
                    c.rescore_s = time.perf_counter() - start
                else:
                    c.logprobs = [LEARNER_LOGPROB] * len(c.token_ids)
        records, parsed = self._records(request, prompt_ids, choices, time.time() - t0)
        self.recorder.add(episode_id, records)
        return parsed

    async def _complete(self, episode_id, request, prompt_ids, params, n) -> JSONResponse:
        t0 = time.time()
        choices = self._submit(request, prompt_ids, params, n)
        try:
            for c in choices:
                while (item := await c.stream.aget()) is not None:
                    if isinstance(item, BaseException):
                        return _error(500, f"generation failed: {type(item).__name__}: {item}", "server_error")
                    self._absorb(c, item)
        except asyncio.CancelledError:
            for c in choices:
                self.policy.abort(c.request_id)
            raise
        parsed = await self._finish(episode_id, request, prompt_ids, params, choices, t0)
        out = [ChatCompletionResponseChoice(
            index=c.index, finish_reason=finish,
            message=ChatMessage(role="assistant", content=content,
                                tool_calls=[ToolCall(id=tc["id"], function=FunctionCall(**tc["function"]))
                                            for tc in tool_calls]))
            for c, (content, tool_calls, finish) in zip(choices, parsed)]
        completion_tokens = sum(len(c.token_ids) for c in choices)
        resp = ChatCompletionResponse(model=request.model or self.policy.model_name, choices=out,
                                      usage=UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                                                      total_tokens=len(prompt_ids) + completion_tokens))
        return JSONResponse(resp.model_dump(exclude_none=True))

    async def _stream(self, episode_id, request, prompt_ids, params, n):
        t0 = time.time()
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"
        model = request.model or self.policy.model_name
        choices = self._submit(request, prompt_ids, params, n)
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(c: _Choice) -> None:
            while True:
                item = await c.stream.aget()
                await merged.put((c, item))
                if item is None or isinstance(item, BaseException):
                    return

        def sse(choice_list: list, usage: UsageInfo | None = None) -> str:
            chunk = ChatCompletionStreamResponse(id=chunk_id, model=model, choices=choice_list, usage=usage)
            return f"data: {chunk.model_dump_json(exclude_unset=True, exclude_none=True)}\n\n"

        pumps = [asyncio.create_task(pump(c)) for c in choices]
        failed: BaseException | None = None
        recorded = False
        try:
            for c in choices:
                yield sse([ChatCompletionResponseStreamChoice(index=c.index, delta=DeltaMessage(role="assistant", content=""))])
            open_streams = len(choices)
            while open_streams:
                c, item = await merged.get()
                if item is None:
                    open_streams -= 1
                    continue
                if isinstance(item, BaseException):
                    failed, open_streams = item, open_streams - 1
                    continue
                chunk = self._stream_chunk(c, item, request, prompt_ids)
                if chunk is not None:
                    yield sse([chunk])
            if failed is not None:
                yield f"data: {json.dumps({'error': {'message': f'generation failed: {failed}', 'type': 'server_error', 'code': 500}})}\n\n"
                return
            # Recorded before the stream ends: a client that read [DONE] finds its call in the log.
            await self._finish(episode_id, request, prompt_ids, params, choices, t0)
            recorded = True
            if request.stream_options is not None and request.stream_options.include_usage:
                completion_tokens = sum(len(c.token_ids) for c in choices)
                yield sse([], UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                                        total_tokens=len(prompt_ids) + completion_tokens))
            yield "data: [DONE]\n\n"
        finally:
            for task in pumps:
                task.cancel()
            if not recorded:  # client went away mid-stream, or generation failed
                self._record_unfinished(episode_id, request, prompt_ids, choices, t0)

    def _stream_chunk(self, c: _Choice, item, request, prompt_ids) -> ChatCompletionResponseStreamChoice | None:
        """Absorb one engine output into its choice; the SSE choice to send for it, if any."""
        o = self._absorb(c, item)
        finished = o.finish_reason is not None
        if c.parser is not None:
            delta = c.parser.parse_delta(o.text, list(o.token_ids), request, prompt_ids, finished=finished)
        else:
            delta = DeltaMessage(content=o.text) if o.text else None
        if delta is not None and delta.tool_calls:
            c.tools_streamed = True
        if finished:
            finish = _finish_reason(request, o.finish_reason, c.tools_streamed)
            return ChatCompletionResponseStreamChoice(index=c.index, delta=delta or DeltaMessage(), finish_reason=finish)
        if delta is not None and (delta.content or delta.tool_calls):
            return ChatCompletionResponseStreamChoice(index=c.index, delta=delta)
        return None

    def _record_unfinished(self, episode_id, request, prompt_ids, choices: list[_Choice], t0: float) -> None:
        """Abort what still runs and record what was generated, so the episode's log stays whole."""
        for c in choices:
            if c.finish_reason is None:
                self.policy.abort(c.request_id)
        records, _ = self._records(request, prompt_ids, choices, time.time() - t0)
        self.recorder.add(episode_id, records)


def engine_timing(out) -> dict:
    """queue/prefill/decode seconds and prefix-cache hits of one request, from vLLM's
    per-request stats (engine-core timestamps); zeros when the engine keeps none."""
    stats = getattr(out, "metrics", None)
    if stats is None or not stats.scheduled_ts:
        return {}
    first = stats.first_token_ts or stats.scheduled_ts
    return {"queue_s": max(0.0, stats.scheduled_ts - stats.queued_ts),
            "prefill_s": max(0.0, first - stats.scheduled_ts),
            "decode_s": max(0.0, (stats.last_token_ts or first) - first),
            "cached_tokens": int(out.num_cached_tokens or 0)}


def _finish_reason(request: ChatCompletionRequest, engine_reason: str, called_tools: bool) -> str:
    """OpenAI's convention: "tool_calls" for auto/required calls, "stop" for a named one."""
    named = isinstance(request.tool_choice, ChatCompletionNamedToolChoiceParam)
    if called_tools and engine_reason == "stop" and not named:
        return "tool_calls"
    return engine_reason


def _validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "request"
        parts.append(f"{loc}: {e['msg']}")
    return "invalid chat completion request: " + "; ".join(parts)


def _advertised_host(bind_host: str) -> str:
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    import ray
    return ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostbyname(socket.gethostname())

