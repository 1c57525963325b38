"""Group-relative advantages and the group-level reward rules of GRPO (rl.grpo's docstring,
steps 1 and 2). Plain Python: the driver computes them, and importing torch there would only
delay the run's start.
"""
from __future__ import annotations

import math
from collections import defaultdict


def _groups(rewards: list[float], group_ids: list[str]) -> dict[str, list[int]]:
    if len(rewards) != len(group_ids):
        raise ValueError(f"rewards ({len(rewards)}) and group_ids ({len(group_ids)}) differ in length")
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    return members


def group_advantages(rewards: list[float], group_ids: list[str], eps: float = 1e-6) -> list[float]:
    """(reward - group mean) / (group std + eps), population std; a zero-std group gets zeros.

    Zero-std groups carry no learning signal: returning exact zeros (instead of 0/eps noise)
    keeps them from contributing to the loss at all.
    """
    out = [0.0] * len(rewards)
    for idx in _groups(rewards, group_ids).values():
        vals = [float(rewards[i]) for i in idx]
        if any(math.isnan(v) for v in vals):
            raise ValueError(f"NaN reward in group of samples {idx}")
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        if std == 0.0:
            continue
        for i, v in zip(idx, vals):
            out[i] = (v - mean) / (std + eps)
    return out


def group_ties(rewards: list[float], tol: float = 0.0) -> bool:
    """A group ties (no GRPO signal) when its rewards span at most tol."""
    return max(rewards) - min(rewards) <= tol


def shape_reward(reward: float, mode: str) -> float:
    """The training reward from the verifier's: "partial" keeps it (F2P share, P2P-gated),
    "binary" is 1.0 only on a full pass."""
    if mode == "partial":
        return float(reward)
    if mode == "binary":
        return 1.0 if reward >= 1.0 else 0.0
    raise ValueError(f"unknown reward mode {mode!r} (partial | binary)")
