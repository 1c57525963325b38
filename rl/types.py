"""Plain data that crosses actor boundaries (picklable dataclasses, no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field


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
