"""pi's `--mode json` stdout, read line by line into counters (the outcome's raw material)."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import IO

STOP_REASONS = ("stop", "length", "toolUse", "error", "aborted")  # pi's own
# ours, when pi did not end the episode itself (names shared with the native scaffold):
WALL_CLOCK, MAX_TURNS = "wall_clock", "max_turns"


@dataclass
class PiEventStream:
    """Incremental reader of pi's `--mode json` stdout; keeps counters, not events."""
    log: IO[str] | None = None
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    edits: int = 0
    edit_failures: int = 0
    retries: int = 0
    stop_reason: str | None = None
    error_message: str | None = None
    final_text: str = ""
    bad_lines: int = 0
    tool_names: list[str] = field(default_factory=list)
    max_turns: int | None = None
    halt_reason: str | None = None
    halted: threading.Event = field(default_factory=threading.Event)

    def feed(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            self.bad_lines += 1
            self._write({"type": "unparsed_stdout", "text": line[:2000]})
            return
        kind = event.get("type")
        if kind == "message_update":
            return
        self._write(event)
        if self.halted.is_set():  # the outcome is fixed; later events are logged, not counted
            return
        if kind == "message_end":
            msg = event.get("message") or {}
            if msg.get("role") == "assistant":
                self.turns += 1
                self.stop_reason = msg.get("stopReason")
                self.error_message = msg.get("errorMessage")
                texts = [c.get("text", "") for c in msg.get("content") or [] if c.get("type") == "text"]
                self.final_text = "".join(texts)
                if self.stop_reason == "length":
                    # pi would still run a truncated tool call and carry on; the episode ends here
                    self._halt("length")
                elif self.stop_reason == "toolUse" and self.max_turns and self.turns >= self.max_turns:
                    self._halt(MAX_TURNS)  # stop before pi asks the policy for another turn
        elif kind == "tool_execution_end":
            self.tool_calls += 1
            self.tool_names.append(str(event.get("toolName")))
            if event.get("isError"):
                self.tool_failures += 1
            if event.get("toolName") == "edit":
                self.edits += 1
                self.edit_failures += int(bool(event.get("isError")))
        elif kind == "auto_retry_start":
            self.retries += 1

    def _halt(self, reason: str) -> None:
        self.halt_reason = reason
        self.halted.set()

    def _write(self, event: dict) -> None:
        if self.log is not None:
            self.log.write(json.dumps(event) + "\n")
            self.log.flush()
