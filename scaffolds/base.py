"""What every scaffold is: one typed inputs record in, one `EpisodeOutcome` out.

A scaffold drives the agent of one episode against the policy server; the reward comes
from the environment afterwards (scaffolds/episode.py runs both and records them).

    class MyScaffold:
        name = "mine"
        def run(self, inputs: ScaffoldInputs) -> EpisodeOutcome: ...
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from rl.config import ScaffoldConfig


@dataclass
class EpisodeOutcome:
    """What a scaffold reports about one episode: how it ended and what the agent did (no
    reward, no tokens: those come from the environment and the policy server's records)."""
    stop_reason: str        # stop | length | max_turns | token_budget | wall_clock | error (pi adds toolUse, aborted)
    turns: int = 0          # model calls
    tool_calls: int = 0
    tool_failures: int = 0
    edits: int = 0          # `edit` calls, and those the tool refused (oldText not the file's text, ...)
    edit_failures: int = 0
    seconds: float = 0.0
    error: str | None = None
    # reported by pi only (the native scaffold leaves the defaults):
    events_path: str | None = None  # pi's JSON event log, when one was asked for
    retries: int = 0                # pi's own auto-retries after provider errors
    exit_code: int | None = None    # pi's process exit code
    final_text: str = ""            # the last assistant message's text (its tail)

    @property
    def ok(self) -> bool:
        """The scaffold finished on its own terms (the task may still be unsolved)."""
        return self.stop_reason == "stop" and self.error is None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ScaffoldInputs:
    """Everything a scaffold needs for one episode, the same for every scaffold."""
    env_actor: Any               # the EnvActor (Ray handle) holding the episode's checkout and tools
    env_episode: str             # the episode's id on that actor
    task_prompt: str             # the task's problem statement, the first user message
    episode_url: str             # the OpenAI base URL under which the policy server records the calls
    model_id: str                # the model name to ask the server for
    cfg: ScaffoldConfig          # turn, token and wall-clock limits
    context_window: int          # rollout.max_model_len
    max_tokens: int              # rollout.max_tokens, per model call
    events_path: str | None = None  # where a scaffold that logs events (pi) writes them


class Scaffold(Protocol):
    """A scaffold: `name` is its config value (scaffold.name, eval.scaffold)."""
    name: str

    def run(self, inputs: ScaffoldInputs) -> EpisodeOutcome: ...
