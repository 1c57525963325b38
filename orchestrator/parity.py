"""Parity probe: after every sync and wake, the served policy must score a fixed sequence
like the learner does. A silent no-op sync (stale adapter, wrong weights) shows up here as
a gap instead of as a run that trains a frozen policy."""
from __future__ import annotations

import ray


class ParityError(RuntimeError):
    pass


def parity_gap(learner_lp: list[float], served_lp: list[float]) -> tuple[float, float]:
    """Mean and max |learner - served| over positions 1.. (position 0 has no prefix)."""
    if len(learner_lp) != len(served_lp):
        raise ParityError(f"parity probe lengths differ: learner {len(learner_lp)} vs served {len(served_lp)}")
    diffs = [abs(a - b) for a, b in zip(learner_lp[1:], served_lp[1:])]
    return sum(diffs) / len(diffs), max(diffs)


def start_parity_probe(learner, workers: list, token_ids: list[int]) -> tuple[ray.ObjectRef, list[ray.ObjectRef]]:
    """Ask the learner and every worker to score token_ids; each answers after its earlier calls."""
    return learner.sequence_logprobs_ref(token_ids), [w.prompt_logprobs.remote(token_ids) for w in workers]


def run_parity_probe(learner, workers: list, token_ids: list[int], threshold: float,
                     when: str) -> tuple[float, float]:
    """The worst worker's (mean, max) |Δ log-prob|; raises ParityError past the threshold (on the mean)."""
    return finish_parity_probe(start_parity_probe(learner, workers, token_ids), threshold, when)


def finish_parity_probe(probe: tuple[ray.ObjectRef, list[ray.ObjectRef]], threshold: float,
                        when: str) -> tuple[float, float]:
    learner_ref, served = probe
    learner_lp = ray.get(learner_ref)
    worst, worst_max = 0.0, 0.0
    for i, served_lp in enumerate(ray.get(served)):
        mean_gap, max_gap = parity_gap(learner_lp, served_lp)
        if mean_gap > threshold:
            raise ParityError(
                f"parity probe failed {when}: rollout worker {i} serves a policy that differs from the "
                f"learner's (mean |Δ log-prob| = {mean_gap:.4f}, max {max_gap:.4f}, threshold {threshold}). "
                f"The weight sync did not take effect; check sync.strategy and the worker's adapter state.")
        worst, worst_max = max(worst, mean_gap), max(worst_max, max_gap)
    return worst, worst_max
