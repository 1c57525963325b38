"""Turn an episode's recorded model calls into training sequences.

A call whose prompt extends the previous call's prompt + completion token-for-token is
merged into the same sequence: the new prompt tokens (tool results, template) join with
mask 0, the new completion with mask 1. Otherwise the chat template re-rendered history
differently from what was generated (e.g. a re-serialized tool call), and the call starts
a new sample; all samples of an episode share its advantage. A scripted call (a rescue
prefix's turn, served from a demonstration) stays in the sequence with mask 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from rl.types import CallRecord, TokenSequence


@dataclass
class Assembly:
    samples: list[TokenSequence]
    merged_calls: int     # calls appended to the previous call's sequence
    split_calls: int      # calls that had to start a new sample (after the first)


def assemble(calls: list[CallRecord]) -> Assembly:
    samples: list[TokenSequence] = []
    merged = split = 0
    for call in calls:
        prev = samples[-1] if samples else None
        if prev is not None and call.prompt_token_ids[:len(prev.token_ids)] == prev.token_ids:
            extra = call.prompt_token_ids[len(prev.token_ids):]
            merged += 1
        else:
            if prev is not None:
                split += 1
            prev = TokenSequence([], [], [])
            samples.append(prev)
            extra = call.prompt_token_ids
        prev.token_ids += extra + call.completion_token_ids
        trained = 0 if call.scripted else 1   # a rescue prefix's turn is context, not the policy's
        prev.loss_mask += [0] * len(extra) + [trained] * len(call.completion_token_ids)
        prev.logprobs += [0.0] * len(extra) + list(call.logprobs)
    return Assembly(samples=[s for s in samples if any(s.loss_mask)], merged_calls=merged, split_calls=split)
