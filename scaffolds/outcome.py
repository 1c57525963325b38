"""What a scaffold reports about one episode (the reward comes from the environment)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EpisodeOutcome:
    stop_reason: str        # stop | length | max_turns | token_budget | wall_clock | error
    turns: int = 0          # model calls
    tool_calls: int = 0
    tool_failures: int = 0
    edits: int = 0          # `edit` calls, and those the tool refused (oldText not the file's text, ...)
    edit_failures: int = 0
    seconds: float = 0.0
    error: str | None = None
