"""A recording proxy in front of any OpenAI-compatible endpoint (a stronger model a user
serves), so episodes against it can become warm-start rows like the project's own.

It listens on the same per-episode URLs as the policy server, `{base}/episodes/<id>/v1`,
forwards each chat request upstream (streamed or not, with the upstream's model name), and
keeps the episode's last request and the assistant message it got back. `take_episode_calls`
then renders that conversation with the *trained* model's chat template
(actors/chat_format.py), so the episode runner assembles the same token rows it would from
the policy server; their log-probs are 0 (not sampled by the trained model).

    proxy = RecordingProxy("http://gpu-box:8000/v1", "Qwen/Qwen3-32B", api_key, model_path)
    base_url = proxy.start()
"""
from __future__ import annotations

import json
import threading

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from actors.http_thread import ThreadedServer, bind_address
from rl.types import CallRecord


class StreamAccumulator:
    """The assistant message of an OpenAI chat stream, from its `data:` lines."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.tool_calls: dict[int, dict] = {}

    def feed(self, line: str) -> None:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if not data or data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            return           # not ours to judge: the client sees the same bytes
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(tc.get("index", 0), {
                    "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""

    def message(self) -> dict:
        msg: dict = {"role": "assistant", "content": "".join(self.content)}
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg


def response_message(body: dict) -> dict | None:
    """The first choice's assistant message of a non-streamed chat response."""
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0].get("message"), dict):
        return None
    msg = {k: v for k, v in choices[0]["message"].items() if k in ("role", "content", "tool_calls")}
    msg["role"] = "assistant"
    msg["content"] = msg.get("content") or ""
    return msg


class RecordingProxy:
    def __init__(self, upstream: str, upstream_model: str, api_key: str | None, model_path: str,
                 host: str = "127.0.0.1", timeout_s: float = 600.0, spans_nodes: bool = False) -> None:
        from transformers import AutoTokenizer
        self.upstream = upstream.rstrip("/")
        self.upstream_model = upstream_model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.host, self.timeout_s = bind_address(host, spans_nodes), timeout_s
        self._lock = threading.Lock()
        self._last: dict[str, tuple[dict, dict]] = {}    # episode -> (request body, reply message)
        self._server: ThreadedServer | None = None

    def start(self) -> str:
        if self._server is None:
            self._server = ThreadedServer(self._app(), self.host, 0, name="recording-proxy")
        return f"http://{self.host}:{self._server.port}"

    def _record(self, episode_id: str, body: dict, message: dict | None) -> None:
        if message is not None:
            with self._lock:
                self._last[episode_id] = (body, message)

    def take_episode_calls(self, episode_id: str) -> list[CallRecord]:
        """The episode's conversation as the trained model's calls (empty if it made none)."""
        with self._lock:
            last = self._last.pop(episode_id, None)
        if last is None:
            return []
        body, message = last
        from actors.chat_format import conversation_calls  # vLLM's request model: ~7 s to import, actor-side only
        return conversation_calls(self.tokenizer, [*body["messages"], message], body.get("tools"))

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.stop()

    def _app(self) -> FastAPI:
        app = FastAPI(title="agentic-rlvr recording proxy")
        client = httpx.AsyncClient(timeout=self.timeout_s)

        @app.get("/health")
        async def health() -> dict:
            return {"ok": True, "upstream": self.upstream}

        @app.get("/episodes/{episode_id}/v1/models")
        async def models(episode_id: str):
            r = await client.get(f"{self.upstream}/models", headers=self.headers)
            return Response(r.content, status_code=r.status_code, media_type="application/json")

        @app.post("/episodes/{episode_id}/v1/chat/completions")
        async def chat(episode_id: str, request: Request):
            try:
                body = await request.json()
            except json.JSONDecodeError:
                return JSONResponse({"error": {"message": "request body is not JSON"}}, status_code=400)
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                return JSONResponse({"error": {"message": "a chat request needs a 'messages' list"}},
                                    status_code=400)
            upstream_body = {**body, "model": self.upstream_model}
            url = f"{self.upstream}/chat/completions"
            if not body.get("stream"):
                r = await client.post(url, json=upstream_body, headers=self.headers)
                if r.status_code == 200:
                    self._record(episode_id, body, response_message(r.json()))
                return Response(r.content, status_code=r.status_code, media_type="application/json")
            r = await client.send(client.build_request("POST", url, json=upstream_body, headers=self.headers),
                                  stream=True)
            if r.status_code != 200:
                content = await r.aread()
                await r.aclose()
                return Response(content, status_code=r.status_code, media_type="application/json")

            async def relay():
                acc = StreamAccumulator()
                try:
                    async for line in r.aiter_lines():
                        acc.feed(line)
                        yield (line + "\n").encode()
                finally:
                    await r.aclose()
                self._record(episode_id, body, acc.message())

            return StreamingResponse(relay(), media_type="text/event-stream")

        return app
