"""Shared-prefix rows (modeling.shared_prefix) against the padded batch, on a tiny random llama."""
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from actors.learner import Learner
from modeling.shared_prefix import (
    common_prefix_length,
    prefix_micro_batches,
    prefix_row,
    row_cost,
    shared_prefix_rows,
)
from rl.config import LearnerConfig, LoraConfig, ModelConfig
from rl.types import TrainSample
from tests.fixtures.models import VOCAB, qwen35
from tests.unit.test_learner import LORA, assert_same_gradients, make_cfg, tiny_model_path  # noqa: F401 (fixture)


def groups(seed=0) -> list[TrainSample]:
    """Two GRPO groups: 5 samples behind a 15-token prompt, 3 behind a 9-token one."""
    rng = random.Random(seed)
    out = []
    for prompt_len, n in ((15, 5), (9, 3)):
        prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
        for _ in range(n):
            rest = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
            out.append(TrainSample(prompt + rest, [0] * prompt_len + [1] * len(rest),
                                   [0.0] * prompt_len + [-rng.uniform(3, 6) for _ in rest], advantage=rng.uniform(-1, 1)))
    return out


def test_micro_batches_count_the_prefix_once():
    batch = groups()
    assert common_prefix_length(batch[:5]) >= 15 and common_prefix_length(batch) < 9
    whole = sum(len(s.token_ids) for s in batch[:5])
    shared = common_prefix_length(batch[:5])
    assert prefix_micro_batches(batch[:5], whole - 4 * shared) == [batch[:5]]
    split = prefix_micro_batches(batch, 60)
    assert [s for g in split for s in g] == batch and len(split) > 1


def test_long_samples_behind_a_short_prompt_train_alone_but_re_rendered_histories_share_a_row():
    """A pi group: a 1.1k-token prompt before 2-3k tokens of each episode's own; one episode's
    three sequences repeat its 7.6k-token history (a re-rendered call). Attention to the prompt
    would cost more than its tokens save; the history is computed once."""
    rng = random.Random(1)
    prompt = [rng.randrange(VOCAB) for _ in range(1100)]

    def sample(ids):
        return TrainSample(ids, [0] * (len(ids) - 1) + [1], [0.0] * len(ids), advantage=1.0)

    def own(n):
        return [rng.randrange(VOCAB) for _ in range(n)]

    history = prompt + own(6500)
    group = [sample(prompt + own(2000)), sample(prompt + own(3000)),
             sample(history + own(70)), sample(history + own(190)), sample(history + own(290))]
    assert prefix_micro_batches(group, 8192) == [[group[0]], [group[1]], group[2:]]
    assert prefix_micro_batches(group, 7900) == [[group[0]], [group[1]], group[2:4], [group[4]]], "budget still binds"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), min_size=1, max_size=8), st.integers(2, 40))
def test_micro_batches_equal_recounting_each_trial(seqs, budget):
    """The incremental planner gives the batches of recomputing each trial batch's prefix."""
    samples = [TrainSample(ids, [0] + [1] * (len(ids) - 1), [0.0] * len(ids), advantage=0.0) for ids in seqs]
    expected, current = [], []
    for s in samples:
        trial = current + [s]
        p = common_prefix_length(trial)
        lengths = [len(x.token_ids) for x in trial]
        if current and (p + sum(n - p for n in lengths) > budget or row_cost(p, lengths) > row_cost(
                common_prefix_length(current), lengths[:-1]) + row_cost(0, lengths[-1:])):
            expected.append(current)
            trial = [s]
        current = trial
    expected.append(current)
    assert prefix_micro_batches(samples, budget) == expected


@pytest.mark.parametrize("budget", [4096, 60])
def test_shared_prefix_step_matches_padded_step(tiny_model_path, budget):  # noqa: F811
    batch = groups()
    plain = Learner(tiny_model_path, make_cfg(micro_batch_tokens=budget), ModelConfig(), seed=0, lora=LORA)
    shared = Learner(tiny_model_path, make_cfg(micro_batch_tokens=budget, layout="shared_prefix"), ModelConfig(),
                     seed=0, lora=LORA)
    mp, ms = plain.train_step(batch), shared.train_step(batch)
    assert ms["tokens"] == mp["tokens"]
    assert ms["loss"] == pytest.approx(mp["loss"], rel=1e-5)
    assert ms["grad_norm"] == pytest.approx(mp["grad_norm"], rel=1e-4) and mp["grad_norm"] > 0
    assert_same_gradients(plain, shared, mp["tokens"])


@torch.no_grad()
def test_remainders_do_not_see_their_siblings(tiny_model_path):  # noqa: F811
    ln = Learner(tiny_model_path, make_cfg(layout="shared_prefix"), ModelConfig(), seed=0, lora=LORA)
    ln.model.eval()
    batch = groups()[:5]
    row = prefix_row(batch)
    want = torch.cat([torch.tensor(ln.sequence_logprobs(s.token_ids))[1:][torch.tensor(s.loss_mask[1:]) == 1]
                      for s in batch])

    def logprobs() -> torch.Tensor:
        hidden = ln._hidden(row["ids"], None, row["positions"])[0, row["src"]]
        return ln.lm_head(hidden).float().log_softmax(-1).gather(1, row["targets"][:, None]).squeeze(1)

    with shared_prefix_rows(row["prefix"], row["spans"]):
        torch.testing.assert_close(logprobs(), want, rtol=1e-4, atol=1e-4)
    assert (logprobs() - want).abs().max() > 1e-3  # the same row read causally: siblings leak in


def test_models_with_other_layers_and_both_layouts_are_refused():
    with pytest.raises(ValueError, match="full attention in every layer"):
        Learner("", LearnerConfig(layout="shared_prefix"), ModelConfig(), seed=0,
                lora=LoraConfig(target_modules=["all-linear"]), base_model=qwen35())
    with pytest.raises(ValidationError, match="layout"):  # one key, one value: a row has one layout
        LearnerConfig(layout=["shared_prefix", "packed"])
