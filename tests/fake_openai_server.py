"""A scripted OpenAI chat-completions server for the ugly cases a real engine rarely produces.

Each incoming call consumes the next `Step` of the script (the last one repeats), so a test
states exactly what the agent sees: an HTTP 500, a stream that stalls, a tool call cut off by
`length`, garbage tool arguments. Standard library only, so it runs anywhere pi runs.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal


@dataclass
class Step:
    kind: Literal["text", "tool_call", "http_error", "stall"]
    content: str = ""
    tool_name: str = ""
    arguments: str = ""            # sent verbatim: may be invalid JSON on purpose
    finish_reason: str = "stop"
    status: int = 500


def text(content: str, finish_reason: str = "stop") -> Step:
    return Step("text", content=content, finish_reason=finish_reason)


def tool_call(name: str, arguments: str, finish_reason: str = "tool_calls") -> Step:
    return Step("tool_call", tool_name=name, arguments=arguments, finish_reason=finish_reason)


def http_error(status: int = 500) -> Step:
    return Step("http_error", status=status)


def stall(content: str = "Let me think") -> Step:
    """Send one delta, then never finish the stream."""
    return Step("stall", content=content)


@dataclass
class FakeOpenAIServer:
    script: list[Step]
    model_id: str = "fake-model"
    requests: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.script:
            raise ValueError("script needs at least one step")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next_step(self, body: dict) -> Step:
        with self._lock:
            self.requests.append(body)
            return self.script[min(len(self.requests), len(self.script)) - 1]

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": server.model_id, "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                step = server._next_step(body)
                if step.kind == "http_error":
                    self._json(step.status, {"error": {"message": "scripted failure", "type": "server_error"}})
                    return
                if not body.get("stream"):
                    self._json(400, {"error": {"message": "this fake only streams"}})
                    return
                self._stream(step)

            def _json(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _event(self, obj: dict | str) -> None:
                payload = obj if isinstance(obj, str) else json.dumps(obj)
                chunk = f"data: {payload}\n\n".encode()
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()

            def _chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
                return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": server.model_id,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

            def _stream(self, step: Step) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self._event(self._chunk({"role": "assistant", "content": ""}))
                if step.kind == "stall":
                    self._event(self._chunk({"content": step.content}))
                    server._stop.wait()  # hold the connection open until the test ends
                    return
                if step.kind == "text":
                    self._event(self._chunk({"content": step.content}))
                else:
                    call = {"index": 0, "id": "call_fake_1", "type": "function",
                            "function": {"name": step.tool_name, "arguments": ""}}
                    self._event(self._chunk({"tool_calls": [call]}))
                    half = len(step.arguments) // 2
                    for part in (step.arguments[:half], step.arguments[half:]):
                        self._event(self._chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}))
                self._event(self._chunk({}, step.finish_reason))
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler
