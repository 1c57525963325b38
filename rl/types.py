"""Plain data that crosses actor boundaries (picklable dataclasses, no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

# a coding task's difficulty level, hardest first (envs/stubs.py says what each stub removes)
Level = Literal["body", "last_lines", "branch", "return", "statement", "mutation"]
LEVELS: tuple[str, ...] = get_args(Level)


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
    logprobs[i] is the rollout's sampled log-prob of token i where loss_mask[i] == 1, else 0;
    NaN (LEARNER_LOGPROB) where the engine sampled under a grammar and the learner's own
    log-prob stands in (see rl.grpo.grpo_token_loss).
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


LEARNER_LOGPROB = float("nan")
"""A recorded log-prob the learner fills in: the token was sampled under a grammar, whose
masked distribution the engine reports, while the loss needs the plain policy's."""


@dataclass
class CallRecord:
    """One chat-completions call as the policy server served it (per choice)."""
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]          # sampled-token log-probs as generated, or LEARNER_LOGPROB
    finish_reason: str
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # parsed OpenAI-style tool calls
    seconds: float = 0.0           # the call's wall time at the server
    queue_s: float = 0.0           # engine: waiting for a batch slot
    prefill_s: float = 0.0         # engine: scheduled -> first token
    decode_s: float = 0.0          # engine: first -> last token
    rescore_s: float = 0.0         # second pass for the unconstrained log-probs (guided_logprobs=rescore)
    cached_tokens: int = 0         # prompt tokens served from the prefix cache
    unparsed_tool_call: bool = False  # opened a tool call that did not parse (clipped, bad JSON)
    scripted: bool = False         # a rescue prefix's turn, served from a demonstration: never trained


@dataclass(frozen=True)
class Prefix:
    """A rescued episode's first calls: assistant messages of a verified demonstration,
    served as scripted turns (orchestrator/rescue.py)."""
    messages: list[dict]
    source: str


@dataclass
class TokenSequence:
    """One rollout sequence before it gets an advantage: prompt + generated tokens.

    loss_mask[i] == 1 marks a token the policy generated; logprobs[i] is its sampled
    log-prob there, else 0.0 (see TrainSample).
    """
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


EPISODE_TIME_PARTS = ("queue", "prefill", "decode", "rescore", "server", "tools", "env", "reward")
"""Where an episode's wall time went: the engine's parts of each model call (queue, prefill,
decode, rescore), the server's own share of a call (rendering, parsing, HTTP), the
scaffold's time between calls (tool execution), opening the checkout, and the reward."""


@dataclass
class EpisodeRecord:
    """What one episode did, the same fields for training and evaluation: the flat, JSON-ready
    row of metrics and episode files (the scaffold's EpisodeOutcome plus reward and token counts).

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
    edits: int | None = None             # `edit` calls, and those the tool refused (oldText not found, ...)
    edit_failures: int | None = None
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
    time_budget: dict | None = None      # seconds by part (rl.types.EPISODE_TIME_PARTS)
    prompt_tokens: int | None = None     # prompt tokens over all calls
    cached_tokens: int | None = None     # ...of which the prefix cache served
    events: str | None = None            # pi's event log, when one was kept
    prefix_calls: int | None = None      # a rescued episode: its first calls came from a demonstration
    prefix_source: str | None = None     # ...which one (task id, variant, seed)
    host_load: float | None = None       # the episode host's 1-minute load average per core at its end:
                                         # above 1, runnable processes wait for a core (the engine's too)

    @classmethod
    def from_dict(cls, data: dict) -> "EpisodeRecord":
        """Read a record back from a JSON line that may carry extra (envelope) keys."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def agentic(self) -> bool:
        return self.tool_calls is not None
