"""Plain data that crosses actor boundaries (picklable dataclasses, no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Completion:
    """One sampled continuation, exactly as the engine generated it."""
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]          # sampled-token log-prob, one per token_ids entry
    text: str
    finish_reason: str             # "stop" | "length" | ...


@dataclass
class TrainSample:
    """One training sequence.

    token_ids is prompt + everything after it. loss_mask[i] == 1 marks a token the policy
    generated (trained on, predicted from position i-1); tool/template/prompt tokens are 0.
    logprobs[i] is the rollout's sampled log-prob of token i where loss_mask[i] == 1, else 0.
    """
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    advantage: float
    group_id: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"TrainSample lengths differ: tokens={n} mask={len(self.loss_mask)} "
                             f"logprobs={len(self.logprobs)}")
        if n and self.loss_mask[0]:
            raise ValueError("loss_mask[0] must be 0: the first token has no prefix to predict it from")


@dataclass
class CallRecord:
    """One chat-completions call as the policy server served it (per choice)."""
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]          # sampled-token log-probs, exactly as generated
    finish_reason: str
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # parsed OpenAI-style tool calls
    seconds: float = 0.0
    unparsed_tool_call: bool = False  # opened a tool call that did not parse (clipped, bad JSON)


@dataclass
class TokenSequence:
    """One rollout sequence before it gets an advantage: prompt + generated tokens.

    loss_mask[i] == 1 marks a token the policy generated; logprobs[i] is its sampled
    log-prob there, else 0.0 (see TrainSample).
    """
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


@dataclass
class EpisodeRecord:
    """What one episode did, the same fields for training and evaluation.

    Built only by the episode runner (scaffolds/episode.py). A single-turn episode (the
    length reward's) fills reward, tokens and clipped, and leaves the agentic fields None.
    """
    reward: float
    tokens: int                          # completion tokens the policy generated
    clipped: bool                        # some model call stopped at its max_tokens
    task: str | None = None
    episode: str | None = None           # the policy server's episode id
    reward_parts: dict | None = None
    edited: bool | None = None
    tests_passed: int | None = None
    tests_total: int | None = None
    turns: int | None = None
    tool_calls: int | None = None
    tool_failures: int | None = None
    unparsed_tool_calls: int | None = None  # model calls that opened a tool call none of which parsed
    stop_reason: str | None = None
    error: str | None = None             # the scaffold's
    reward_error: str | None = None      # the verifier's
    reward_flags: list[str] | None = None  # tampering / screen findings (non-empty: reward 0)
    calls: int | None = None
    merged_calls: int | None = None
    split_calls: int | None = None
    seconds: float | None = None
    reward_seconds: float | None = None
    events: str | None = None            # pi's event log, when one was kept

    @classmethod
    def from_dict(cls, data: dict) -> "EpisodeRecord":
        """Read a record back from a JSON line that may carry extra (envelope) keys."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def agentic(self) -> bool:
        return self.tool_calls is not None
