"""Several samples in one row, with per-sequence boundaries.

GRPO batches hold samples of very different lengths; padding them to the longest wastes the
compute of every pad token. A packed row concatenates the samples instead. Boundaries are then
kept by three things:
- attention: position ids restart at 0 for each sample; transformers turns that into a
  block-diagonal causal mask (masking_utils.find_packed_sequence_indices);
- Gated-DeltaNet and its causal conv: `cu_seqlens` (cumulative sequence starts) reset the
  recurrent and convolution state at each sample. The kernels read it from packed_rows(),
  a process global like linear_attention_segments' (the recompute inside backward may run on
  autograd's own thread, which would not see a context variable);
- the loss: the first token of each sample is never a target of the previous sample's last token.
"""
from __future__ import annotations

import contextlib

import torch

from rl.types import TrainSample

# (cu_seqlens on the device, the same on the CPU) of the row being computed, or None
_ACTIVE: list = [None]


@contextlib.contextmanager
def packed_rows(cu_seqlens: torch.Tensor):
    """Inside the block, linear-attention kernels treat each [cu[i], cu[i+1]) span as its own sequence."""
    previous = _ACTIVE[0]
    _ACTIVE[0] = (cu_seqlens, cu_seqlens.detach().to("cpu"))
    try:
        yield
    finally:
        _ACTIVE[0] = previous


def active_cu_seqlens() -> tuple[torch.Tensor, torch.Tensor] | None:
    """(device, cpu) cu_seqlens of the packed row in force, or None for plain rows."""
    return _ACTIVE[0]


def micro_batches(samples: list[TrainSample], budget: int, packed: bool = False) -> list[list[TrainSample]]:
    """Greedy in order: a micro-batch's size stays within the token budget, counted padded
    (count x longest, one row per sample) or packed (the sum of lengths, one row).

    A sample longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    used = longest = 0
    for s in samples:
        n = len(s.token_ids)
        size = used + n if packed else max(longest, n) * (len(current) + 1)
        if current and size > budget:
            batches.append(current)
            current, used, longest = [], 0, 0
        current.append(s)
        used, longest = used + n, max(longest, n)
    if current:
        batches.append(current)
    return batches


def packed_micro_batches(samples: list[TrainSample], budget: int) -> list[list[TrainSample]]:
    return micro_batches(samples, budget, packed=True)


def pack(batch: list[TrainSample], weights: list[float] | None = None) -> dict[str, torch.Tensor]:
    """One row: ids/positions [1, L], cu_seqlens [n+1] (int32 on CPU), and per-token mask/old/adv/w [1, L]
    (w: each sample's loss weight, rl.grpo.sequence_weights; 1.0 when not given).

    mask is False at every sample's first token, so no target crosses a boundary.
    """
    lengths = [len(s.token_ids) for s in batch]
    cu = torch.zeros(len(batch) + 1, dtype=torch.long)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    ids = torch.tensor([t for s in batch for t in s.token_ids], dtype=torch.long)[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    mask = torch.tensor([bool(m) for s in batch for m in s.loss_mask])[None]
    mask[0, cu[:-1]] = False
    old = torch.tensor([x for s in batch for x in s.logprobs], dtype=torch.float32)[None]
    adv = torch.cat([torch.full((n,), float(s.advantage)) for s, n in zip(batch, lengths)])[None]
    w = torch.cat([torch.full((n,), float(x)) for x, n in zip(weights or [1.0] * len(batch), lengths)])[None]
    return {"ids": ids, "positions": pos, "cu_seqlens": cu, "mask": mask, "old": old, "adv": adv, "w": w}
