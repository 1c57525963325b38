"""Cheap built-in verifiable rewards for closing the loop without an environment."""
from __future__ import annotations

from rl.types import Completion


def length_reward(completion: Completion, max_tokens: int) -> float:
    """'Push shorter completions': 1 for an immediate end, 0 for running out of tokens.

    Movable by any policy that can emit its end-of-turn token, so a rising mean proves the
    served policy is the one being trained.
    """
    if completion.finish_reason == "length":
        return 0.0
    return max(0.0, 1.0 - len(completion.token_ids) / max_tokens)


# Prompts for the loop-closure run: open-ended, so the base model tends to ramble.
LENGTH_PROMPTS = [
    "Tell me about the history of the printing press.",
    "Explain how a hash map works.",
    "Describe your favourite city and why you like it.",
    "Write a short story about a lighthouse keeper.",
    "What are the benefits of regular exercise?",
    "Explain recursion to a beginner programmer.",
    "Describe the water cycle.",
    "What makes a good team leader?",
    "Explain what a compiler does.",
    "Describe how bread is made.",
    "Why is the sky blue?",
    "Give advice to someone learning to cook.",
    "Explain the rules of chess briefly.",
    "What is machine learning?",
    "Describe a day at the beach.",
    "How do airplanes fly?",
]
