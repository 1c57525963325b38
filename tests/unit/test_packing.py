"""Packed rows (modeling.packing) against unpacked ones, on a tiny random Qwen3.5 (Gated-DeltaNet + attention)."""
import random

import pytest
import torch

from actors.learner import Learner
from modeling.packing import pack, packed_micro_batches, packed_rows
from rl.config import LearnerConfig, LoraConfig, ModelConfig
from rl.types import TrainSample
from tests.fixtures.models import VOCAB, qwen35


def samples(lengths=(70, 131, 45), seed=0) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        prompt = min(rng.randint(3, 9), n - 1)
        ids = [rng.randrange(VOCAB) for _ in range(n)]
        lps = [0.0] * prompt + [-rng.uniform(3.0, 6.0) for _ in range(n - prompt)]
        out.append(TrainSample(ids, [0] * prompt + [1] * (n - prompt), lps, advantage=(-1.0) ** i))
    return out


def learner(**kw) -> Learner:
    cfg = LearnerConfig(lr=5e-2, logit_chunk_tokens=16, micro_batch_tokens=4096, **kw)
    return Learner("", cfg, ModelConfig(), seed=0, lora=LoraConfig(rank=4, alpha=8, target_modules=["all-linear"]),
                   base_model=qwen35())


def test_packed_micro_batches_respect_budget_and_keep_order():
    batch = samples((50, 60, 30, 200, 10))
    groups = packed_micro_batches(batch, 120)
    assert [s for g in groups for s in g] == batch
    assert [[len(s.token_ids) for s in g] for g in groups] == [[50, 60], [30], [200], [10]]


def test_pack_blocks_targets_across_boundaries():
    batch = samples((5, 4))
    for s in batch:
        s.loss_mask = [1] * len(s.token_ids)
    row = pack(batch)
    assert row["cu_seqlens"].tolist() == [0, 5, 9]
    assert row["positions"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert row["mask"].tolist() == [[False, True, True, True, True, False, True, True, True]]


@torch.no_grad()
def test_packed_logprobs_match_unpacked_rows():
    ln = learner(layout="packed")
    ln.model.eval()
    batch = samples()
    want = [torch.tensor(ln.sequence_logprobs(s.token_ids)[1:]) for s in batch]
    row = pack(batch)
    cu = row["cu_seqlens"].tolist()

    def packed(boundaries: bool) -> list[torch.Tensor]:
        ctx = packed_rows(row["cu_seqlens"]) if boundaries else torch.enable_grad()
        with ctx:
            hidden = ln._hidden(row["ids"], None, row["positions"] if boundaries else None)[0]
        logits = ln.lm_head(hidden).float().log_softmax(-1)
        lp = logits[:-1].gather(1, row["ids"][0, 1:, None]).squeeze(1)
        return [lp[s:e - 1] for s, e in zip(cu[:-1], cu[1:])]

    got = packed(True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    leaked = packed(False)  # no boundaries: the later samples see their predecessors
    assert (leaked[1] - want[1]).abs().max() > 1e-3


def test_packed_step_matches_padded_step():
    batch = samples()
    plain, packed = learner(), learner(layout="packed")
    mp, mk = plain.train_step(batch), packed.train_step(batch)
    assert mk["loss"] == pytest.approx(mp["loss"], rel=1e-5)
    assert mk["tokens"] == mp["tokens"]
    assert mk["grad_norm"] == pytest.approx(mp["grad_norm"], rel=1e-4) and mp["grad_norm"] > 0
    a, b = plain.lora_state(), packed.lora_state()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
