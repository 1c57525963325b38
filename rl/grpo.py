"""GRPO's clipped per-token policy loss (the learner's side; the group advantages it reads
are rl.advantages').

The algorithm, as this project runs it (1 and 2 in rl.advantages):
1. A group is G episodes of one prompt/task; an episode's advantage is its reward minus the
   group mean, divided by the group's population std (+1e-6). One advantage per episode,
   shared by all its sequences and tokens.
2. A group whose rewards are all equal gets exactly zero advantage; with beta = 0 its
   samples are dropped before the update (they would add exactly zero gradient).
3. Only tokens the policy generated are trained (loss_mask = 1); prompt, tool-result and
   chat-template tokens are masked out.
4. Per token: ratio = exp(logp - logp_rollout), against the log-probs recorded when the
   token was sampled; objective min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
   (asymmetric clip, eps_high > eps_low).
5. Optional KL to the reference (k3 estimator) with weight beta; beta = 0 (the default)
   loads no reference model.
6. Aggregation (learner.loss_agg): "token_mean" (the default, DAPO) sums the loss over trained
   tokens and divides by the number of trained tokens in the whole batch (all micro-batches
   and ranks), so every token weighs the same; "seq_mean" (original GRPO) averages each
   sequence's tokens, then the sequences, so a long sequence weighs as much as a short one.
7. Optional truncated importance sampling (learner.tis_cap = C): the served engine's log-probs
   differ slightly from the learner's for the same weights. With C set, the PPO ratio is taken
   against the learner's own (detached) log-probs -- one update per batch, so it is 1 and the
   clip is inactive -- and each token is weighted by min(p_learner / p_served, C), detached.
   Without it the ratio is taken against the served log-probs, so the mismatch shows up as
   ratio noise and clipping.

Kept free of model code so the same functions serve the naive and the chunked loss paths
and can be tested on hand-made numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.types import TokenSequence, TrainSample


def sequence_weights(token_counts: list[int], mode: str, total_tokens: int, total_sequences: int) -> list[float]:
    """Per-token loss weight of each trained sequence: the batch loss is sum(weight * token loss).

    total_tokens / total_sequences count the whole batch (every micro-batch and rank), so
    shards add up to the same loss as one learner on the whole batch.
    """
    if mode == "token_mean":
        return [1.0 / total_tokens] * len(token_counts)
    if mode == "seq_mean":
        return [1.0 / (total_sequences * n) if n else 0.0 for n in token_counts]
    raise ValueError(f"unknown loss aggregation {mode!r} (token_mean | seq_mean)")


@dataclass
class TokenLoss:
    """Per-token GRPO terms; sums (not means) so micro-batches and ranks can be added up."""
    loss: torch.Tensor        # [N] per-token loss (fp32), to be weighted and summed (sequence_weights)
    clipped: torch.Tensor     # [N] bool, the clipped branch was active
    ratio: torch.Tensor       # [N] importance ratio (detached)
    kl: torch.Tensor | None   # [N] k3 KL estimate to the reference (detached), if beta > 0
    is_weight: torch.Tensor | None = None  # [N] truncated IS weight (detached), if tis_cap is set
    is_capped: torch.Tensor | None = None  # [N] bool, the IS weight hit the cap


def grpo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> TokenLoss:
    """Clipped-ratio surrogate, optional truncated IS weight (tis_cap), optional k3 KL penalty.

    old_logp are the rollout (served) log-probs. All inputs are [N] over the trained tokens;
    math runs in fp32 whatever the model dtype. A NaN old log-prob (rl.types.LEARNER_LOGPROB:
    sampled under a grammar, not recorded) takes this pass's own, detached: the update is one
    optimizer step on fresh rollouts, so the policy that sampled is the one scoring here, and
    the ratio (and the IS weight) there is exactly 1.
    """
    logp = logp.float()
    old_logp = old_logp.float().to(logp.device)
    old_logp = torch.where(torch.isnan(old_logp), logp.detach(), old_logp)
    adv = advantages.float().to(logp.device)
    is_weight = is_capped = None
    if tis_cap is None:
        ratio = torch.exp(logp - old_logp)
    else:
        raw = torch.exp(logp.detach() - old_logp)
        is_weight = torch.clamp(raw, max=tis_cap)
        is_capped = raw > tis_cap
        ratio = torch.exp(logp - logp.detach())
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    unclipped_obj = ratio * adv
    clipped_obj = clipped_ratio * adv
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    clipped = (clipped_obj < unclipped_obj).detach()
    if is_weight is not None:
        loss = loss * is_weight
    kl = None
    if beta > 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (log-probs under the reference policy)")
        delta = ref_logp.float().to(logp.device) - logp
        kl_tok = torch.exp(delta) - delta - 1.0
        loss = loss + beta * kl_tok
        kl = kl_tok.detach()
    return TokenLoss(loss=loss, clipped=clipped, ratio=ratio.detach(), kl=kl, is_weight=is_weight,
                     is_capped=is_capped)


def sampled_entropy(samples: list[TokenSequence] | list[TrainSample]) -> float | None:
    """The policy's per-token entropy, estimated from the served log-probs of the tokens it
    sampled: E[-log p(x)] over x ~ p is the entropy, so the mean of -logprob over generated
    tokens estimates it at no cost (exact in expectation at temperature 1; at other
    temperatures it is the entropy of the tempered distribution the engine sampled from).
    Grammar-sampled tokens (NaN log-probs) are left out; None when no token is left."""
    total, n = 0.0, 0
    for s in samples:
        for m, lp in zip(s.loss_mask, s.logprobs):
            if m and lp == lp:
                total -= lp
                n += 1
    return total / n if n else None
