"""Shared-prefix rows: a micro-batch's common prefix computed once.

A GRPO group's samples start with the same prompt. A shared-prefix row holds that prefix once
and each sample's remainder after it, positions continuing the prefix's. Its attention (one
function registered with transformers, in force while a row is being computed) runs the
prefix causally and each remainder against the prefix's keys and its own, never a sibling's;
so every sample's log-probs are those of its own full sequence, and the prefix's forward and
backward are done once instead of once per sample (its gradient is the sum over the samples,
as before). A 4D mask over the whole row would compute the same thing at a row-squared cost:
on one CPU thread that made a row of 8 x 64-token remainders behind a 45-token prompt 0.86x
the padded batch's update time, where the prefix's share of its tokens promised 0.64x.
Only full-attention layers can read such a row: a recurrent (Gated-DeltaNet) layer would carry
one remainder's state into the next, and a sliding window would be lost.
"""
from __future__ import annotations

import contextlib

import torch

from rl.types import TrainSample

ATTENTION = "rlvr_shared_prefix"
# (prefix length, [(start, end) of each remainder in the row], {(remainder length, device): its mask})
# of the row being computed, or None (the masks are built once per row, not once per layer);
# a process global, not a context variable: the recompute inside backward may run on autograd's thread
_ACTIVE: list = [None]


def _shared(first: list[int], n: int, ids: list[int]) -> int:
    """How many of the first `n` tokens of `first` `ids` also starts with, leaving it one of its own."""
    n, k = min(n, len(ids) - 1), 0
    while k < n and ids[k] == first[k]:
        k += 1
    return k


def common_prefix_length(batch: list[TrainSample]) -> int:
    """Tokens every sample of the batch starts with, leaving each at least one token of its own."""
    if len(batch) < 2:
        return 0
    first = batch[0].token_ids
    n = len(first) - 1
    for s in batch[1:]:
        n = _shared(first, n, s.token_ids)
    return max(n, 0)


# What one query-key pair of attention costs, in tokens of the rest of the model (forward, recompute
# and backward of every linear layer): measured on SmolLM2-135M under bf16 autocast on a 2-core CPU
# (38 s of SDPA for 15.8M pairs a layer, 27 s for the rest
# of 9,535 tokens). It only decides which samples share a row, never what a row computes.
PAIR_COST = 8.5e-4


def row_cost(prefix: int, lengths: list[int]) -> float:
    """Token-equivalents of one row: its tokens, plus its attention pairs. The prefix attends
    causally once; each remainder attends to the whole prefix and to itself under a mask, which
    the attention kernel computes in full (no causal skipping): remainder x its whole length.
    A lone sample (or a row with no common prefix) is plain causal attention per span."""
    if len(lengths) < 2 or prefix == 0:
        return sum(n + PAIR_COST * n * n / 2 for n in lengths)
    tokens = prefix + sum(n - prefix for n in lengths)
    return tokens + PAIR_COST * (prefix * prefix / 2 + sum((n - prefix) * n for n in lengths))


def prefix_micro_batches(samples: list[TrainSample], budget: int) -> list[list[TrainSample]]:
    """Greedy in order, like modeling.packing.micro_batches, counting a micro-batch as its row will
    be computed: the common prefix once plus every sample's remainder. A sample joins the row
    when that stays within the budget and costs no more than training it alone (row_cost): an
    episode's re-rendered sequences, which repeat its whole history, join; long samples that
    share only a short prompt train alone, since a remainder's masked attention to the prefix
    would cost more than the prompt's tokens save. The prefix is kept incrementally (adding a
    sample can only shorten it), so planning is linear in the tokens."""
    batches: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    n = total = 0  # the current batch's running prefix bound (first sample's length - 1) and token count
    for s in samples:
        if current:
            m = _shared(current[0].token_ids, n, s.token_ids)
            lengths = [len(x.token_ids) for x in current]
            if (m + (total + len(s.token_ids)) - m * (len(current) + 1) <= budget
                    and row_cost(m, lengths + [len(s.token_ids)])
                    <= row_cost(n if len(current) > 1 else 0, lengths) + row_cost(0, [len(s.token_ids)])):
                current, n, total = current + [s], m, total + len(s.token_ids)
                continue
            batches.append(current)
        current, n, total = [s], len(s.token_ids) - 1, len(s.token_ids)
    if current:
        batches.append(current)
    return batches


def prefix_row(batch: list[TrainSample], weights: list[float] | None = None) -> dict:
    """One row: ids/positions [1, L], `prefix` (its length), `spans` (each remainder's [start, end)),
    and per trained target of each sample, in sample order: `src` (the row index whose hidden
    state predicts it), `targets`, `old`, `adv`, `w` (the sample's loss weight, 1.0 when not given)."""
    p = common_prefix_length(batch)
    ids, pos, spans = list(batch[0].token_ids[:p]), list(range(p)), []
    src, targets, old, adv, w = [], [], [], [], []
    for s, weight in zip(batch, weights or [1.0] * len(batch)):
        start = len(ids)
        ids += s.token_ids[p:]
        pos += range(p, len(s.token_ids))
        spans.append((start, len(ids)))
        for k in range(1, len(s.token_ids)):
            if s.loss_mask[k]:
                src.append(k - 1 if k - 1 < p else start + k - 1 - p)
                targets.append(s.token_ids[k])
                old.append(s.logprobs[k])
                adv.append(float(s.advantage))
                w.append(float(weight))
    return {"ids": torch.tensor([ids], dtype=torch.long), "positions": torch.tensor([pos], dtype=torch.long),
            "prefix": p, "spans": spans, "src": torch.tensor(src, dtype=torch.long),
            "targets": torch.tensor(targets, dtype=torch.long), "old": torch.tensor(old, dtype=torch.float32),
            "adv": torch.tensor(adv, dtype=torch.float32), "w": torch.tensor(w, dtype=torch.float32)}


@contextlib.contextmanager
def shared_prefix_rows(prefix: int, spans: list[tuple[int, int]]):
    """Inside the block, the registered attention reads rows laid out as prefix_row lays them."""
    previous = _ACTIVE[0]
    _ACTIVE[0] = (prefix, spans, {})
    try:
        yield
    finally:
        _ACTIVE[0] = previous


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention interface ([B, H, L, D] in, [B, L, H, D] out), SDPA underneath.
    Outside a shared-prefix block (the parity probe: one unpadded sequence) it is plain causal SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = _ACTIVE[0]
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    p, spans, masks = layout
    outs = []
    if p:
        outs.append(sdpa_attention_forward(module, query[:, :, :p], key[:, :, :p], value[:, :, :p], None, dropout,
                                           scaling, is_causal=True)[0])
    for start, end in spans:
        q = query[:, :, start:end]
        if not p:
            outs.append(sdpa_attention_forward(module, q, key[:, :, start:end], value[:, :, start:end], None,
                                               dropout, scaling, is_causal=True)[0])
            continue
        n = end - start  # query j sees the whole prefix and its own remainder up to j
        allowed = masks.get((n, query.device))
        if allowed is None:
            allowed = torch.ones(n, p + n, dtype=torch.bool, device=query.device)
            allowed[:, p:] = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
            masks[(n, query.device)] = allowed = allowed[None, None]
        k = torch.cat([key[:, :, :p], key[:, :, start:end]], dim=2)
        v = torch.cat([value[:, :, :p], value[:, :, start:end]], dim=2)
        outs.append(sdpa_attention_forward(module, q, k, v, allowed, dropout, scaling,
                                           is_causal=False)[0])
    return torch.cat(outs, dim=1), None


def use_shared_prefix_attention(model: torch.nn.Module) -> None:
    """Route `model`'s attention through the shared-prefix function; a clear error where its
    layers cannot read a shared-prefix row."""
    from transformers import AttentionInterface

    config = model.config
    other = sorted(set(getattr(config, "layer_types", None) or []) - {"full_attention"})
    if other:
        raise ValueError(f"learner.layout=shared_prefix needs full attention in every layer; this model also has "
                         f"{other} layers. Use learner.layout=packed instead")
    AttentionInterface.register(ATTENTION, _attention)
    model.set_attn_implementation(ATTENTION)
