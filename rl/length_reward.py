"""Cheap built-in verifiable rewards for closing the loop without an environment."""
from __future__ import annotations

from collections.abc import Collection

from rl.types import Completion


def length_reward(completion: Completion, max_tokens: int, end_ids: Collection[int] = ()) -> float:
    """'Push shorter completions': 1 for an immediate end, 0 for running out of tokens.

    Movable by any policy that can emit its end-of-turn token, so a rising mean proves the
    served policy is the one being trained. A completion that ran on past an end token (one of
    `end_ids`; rollout.ignore_eos) is scored where the first one fell, as if it had stopped there.
    """
    first_end = next((i for i, t in enumerate(completion.token_ids) if t in end_ids), None)
    if first_end is not None:
        return max(0.0, 1.0 - (first_end + 1) / max_tokens)
    if completion.finish_reason == "length":
        return 0.0
    return max(0.0, 1.0 - len(completion.token_ids) / max_tokens)


# Prompts for the loop-closure run: short questions the base model answers at very
# different lengths (measured: 4..48+ tokens for one prompt), so groups have reward variance.
LENGTH_PROMPTS = [
    "Say hi.",
    "Name a fruit.",
    "Is water wet?",
    "What is the capital of France?",
    "Name an animal.",
    "Name a color.",
    "Say goodbye.",
    "Name a country.",
    "What is your name?",
    "Give me one word.",
    "Name a planet.",
    "Name a vegetable.",
]
