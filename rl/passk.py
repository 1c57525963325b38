"""Unbiased estimators over n samples of one task: pass@k and the expected best-of-k reward.

pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, openai/human-eval): the chance that at
least one of k samples drawn without replacement from the n passes. The best-of-k reward is
the expected maximum reward of such k samples: with rewards sorted ascending, the i-th
smallest (1-based) is the maximum of a k-subset in C(i-1, k-1) of the C(n, k) subsets.
Both are exact averages over all k-subsets, so they are unbiased for k <= n.
"""
from __future__ import annotations

from math import comb


def _check(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be between 1 and the number of samples n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples passes), from c passes among n samples."""
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"c={c} passes is not between 0 and n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def best_of_k_reward(rewards: list[float], k: int) -> float:
    """Expected max reward of k samples drawn without replacement from these n rewards."""
    n = len(rewards)
    _check(n, k)
    ordered = sorted(float(r) for r in rewards)
    return sum(comb(i - 1, k - 1) * r for i, r in enumerate(ordered, start=1)) / comb(n, k)
