import math

import pytest
import torch

from modeling.fused_logprob import chunked_target_logprobs, naive_target_logprobs
from rl.advantages import group_advantages, group_ties, shape_reward
from rl.grpo import grpo_token_loss, sequence_weights


def test_group_advantages_hand_numbers():
    rewards = [1.0, 0.0, 0.5, 0.5, 2.0, 4.0]
    groups = ["a", "a", "b", "b", "c", "c"]
    adv = group_advantages(rewards, groups, eps=0.0)
    assert adv[:2] == pytest.approx([1.0, -1.0])       # mean 0.5, population std 0.5
    assert adv[2:4] == [0.0, 0.0]                       # zero-std group -> exact zeros
    assert adv[4:] == pytest.approx([-1.0, 1.0])
    assert [group_ties(rewards[i:i + 2]) for i in (0, 2, 4)] == [False, True, False]
    assert group_ties([0.5, 0.5 + 1e-9], tol=1e-6) and not group_ties([0.5, 0.5 + 1e-9])


def test_group_advantages_interleaved_groups_and_bad_input():
    adv = group_advantages([0.0, 3.0, 1.0, 3.0], ["x", "y", "x", "y"], eps=0.0)
    assert adv == pytest.approx([-1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="differ in length"):
        group_advantages([1.0], ["a", "b"])
    with pytest.raises(ValueError, match="NaN"):
        group_advantages([math.nan, 1.0], ["a", "a"])


def test_token_loss_ratio_one_is_minus_advantage():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    tl = grpo_token_loss(lp, lp.detach().clone(), torch.tensor([2.0, -1.0]), 0.2, 0.28)
    assert tl.loss.tolist() == pytest.approx([-2.0, 1.0])
    assert not tl.clipped.any()
    assert tl.ratio.tolist() == pytest.approx([1.0, 1.0])
    tl.loss.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-2.0, 1.0])  # d(-r*A)/dlogp = -A at r=1


def test_token_loss_clipping_is_asymmetric_and_stops_gradient():
    old = torch.zeros(4)
    lp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    tl = grpo_token_loss(lp, old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    # r=1.5,A>0 -> clipped at 1.28; r=1.5,A<0 -> unclipped; r=0.5,A>0 -> unclipped; r=0.5,A<0 -> clipped at 0.8
    assert tl.loss.tolist() == pytest.approx([-1.28, 1.5, -0.5, 0.8])
    assert tl.clipped.tolist() == [True, False, False, True]
    tl.loss.sum().backward()
    assert lp.grad[0].item() == 0.0 and lp.grad[3].item() == 0.0
    assert lp.grad[1].item() == pytest.approx(1.5) and lp.grad[2].item() == pytest.approx(-0.5)


def test_token_loss_kl_k3():
    lp = torch.tensor([-1.0, -1.0])
    ref = torch.tensor([-1.0, -0.5])
    tl = grpo_token_loss(lp, lp, torch.zeros(2), 0.2, 0.2, beta=0.1, ref_logp=ref)
    expected = math.exp(0.5) - 0.5 - 1
    assert tl.kl.tolist() == pytest.approx([0.0, expected])
    assert tl.loss.tolist() == pytest.approx([0.0, 0.1 * expected])
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_token_loss(lp, lp, torch.zeros(2), 0.2, 0.2, beta=0.1)


@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_chunked_logprobs_match_naive_values_and_grads(chunk):
    g = torch.Generator().manual_seed(0)
    n, h, v = 37, 16, 300
    hidden = torch.randn(n, h, generator=g) * 2
    weight = torch.randn(v, h, generator=g)
    targets = torch.randint(0, v, (n,), generator=g)
    upstream = torch.randn(n, generator=g)

    def run(fn):
        hh = hidden.clone().requires_grad_()
        ww = weight.clone().requires_grad_()
        out = fn(hh, ww)
        (out * upstream).sum().backward()
        return out.detach(), hh.grad, ww.grad

    ref = run(lambda hh, ww: naive_target_logprobs(hh, ww, targets))
    got = run(lambda hh, ww: chunked_target_logprobs(hh, ww, targets, chunk))
    for r, c in zip(ref, got):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


def test_chunked_logprobs_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 4, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=g)
    # the forward returns fp32 by design; compare the analytic backward to the naive float64 path
    lp = chunked_target_logprobs(hidden, weight, targets, 2)
    gh, gw = torch.autograd.grad(lp.sum(), (hidden, weight))
    ref = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).sum()
    rh, rw = torch.autograd.grad(ref, (hidden, weight))
    torch.testing.assert_close(gh, rh, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gw, rw.to(gw.dtype), rtol=1e-6, atol=1e-6)


def test_chunked_logprobs_frozen_weight_and_bad_shapes():
    hidden = torch.randn(6, 4, requires_grad=True)
    weight = torch.randn(9, 4)  # frozen LM head: no weight gradient is computed
    lp = chunked_target_logprobs(hidden, weight, torch.arange(6), 4)
    lp.sum().backward()
    assert hidden.grad is not None and weight.grad is None
    assert (lp <= 0).all()
    with pytest.raises(ValueError, match="hidden"):
        chunked_target_logprobs(torch.randn(2, 3, 4), weight, torch.arange(2))


def test_nan_old_logprob_is_the_learners_own():
    """LEARNER_LOGPROB (NaN) positions: ratio exactly 1, the on-policy gradient -adv * dlogp."""
    from rl.types import LEARNER_LOGPROB
    logp = torch.tensor([-0.5, -1.2, -2.0], requires_grad=True)
    old = torch.tensor([LEARNER_LOGPROB, -1.0, LEARNER_LOGPROB])
    adv = torch.tensor([1.0, 1.0, -2.0])
    tl = grpo_token_loss(logp, old, adv, 0.2, 0.28)
    assert torch.isfinite(tl.loss).all()
    assert tl.ratio[0] == 1.0 and tl.ratio[2] == 1.0
    assert tl.ratio[1] == pytest.approx(math.exp(-0.2))
    tl.loss.sum().backward()
    assert logp.grad[0] == pytest.approx(-1.0) and logp.grad[2] == pytest.approx(2.0)


# ---- loss options (learner.loss_agg / clip_eps_high / tis_cap, task.reward_mode) -------------------
def _aggregate(token_loss: torch.Tensor, counts: list[int], mode: str) -> torch.Tensor:
    weights = sequence_weights(counts, mode, sum(counts), len(counts))
    per_token = torch.cat([torch.full((n,), w) for n, w in zip(counts, weights)])
    return (token_loss * per_token).sum()


def test_loss_aggregation_token_mean_vs_seq_mean():
    # one short sequence (1 token, loss 3) and one long (3 tokens, loss 1 each)
    token_loss = torch.tensor([3.0, 1.0, 1.0, 1.0])
    assert _aggregate(token_loss, [1, 3], "token_mean").item() == pytest.approx(6 / 4)   # every token alike
    assert _aggregate(token_loss, [1, 3], "seq_mean").item() == pytest.approx((3 + 1) / 2)  # every sequence alike
    # split across two "ranks": each shard's weights use the whole batch's totals and add up to the same loss
    for mode in ("token_mean", "seq_mean"):
        a = sequence_weights([1], mode, 4, 2)[0] * 3.0
        b = sequence_weights([3], mode, 4, 2)[0] * 3.0
        assert a + b == pytest.approx(_aggregate(token_loss, [1, 3], mode).item())
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        sequence_weights([1], "sum", 1, 1)


def test_clip_higher_widens_only_the_upper_clip():
    old = torch.zeros(2)
    lp = torch.log(torch.tensor([1.25, 0.75]))
    adv = torch.tensor([1.0, -1.0])
    symmetric = grpo_token_loss(lp, old, adv, clip_eps_low=0.2, clip_eps_high=0.2)
    higher = grpo_token_loss(lp, old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    assert symmetric.loss.tolist() == pytest.approx([-1.2, 0.8])   # both clipped
    assert higher.loss.tolist() == pytest.approx([-1.25, 0.8])     # ratio 1.25 < 1.28: upper clip lifted
    assert symmetric.clipped.tolist() == [True, True] and higher.clipped.tolist() == [False, True]


def test_truncated_importance_sampling_weights_and_caps():
    served = torch.log(torch.tensor([0.5, 0.1, 0.4]))
    learner = torch.log(torch.tensor([0.6, 0.5, 0.2])).requires_grad_()  # p_learner / p_served = 1.2, 5, 0.5
    adv = torch.tensor([1.0, 1.0, -2.0])
    tl = grpo_token_loss(learner, served, adv, 0.2, 0.28, tis_cap=2.0)
    assert tl.is_weight.tolist() == pytest.approx([1.2, 2.0, 0.5])     # 5 capped at 2
    assert tl.is_capped.tolist() == [False, True, False]
    assert tl.ratio.tolist() == pytest.approx([1.0, 1.0, 1.0])          # PPO ratio vs the learner itself
    assert tl.loss.tolist() == pytest.approx([-1.2, -2.0, 1.0])         # -w * A
    assert not tl.clipped.any()
    tl.loss.sum().backward()
    assert learner.grad.tolist() == pytest.approx([-1.2, -2.0, 1.0])    # d/dlogp = -w * A
    # without the cap, the ratio is taken against the served log-probs and clips: token 2's gradient is gone
    lp = learner.detach().clone().requires_grad_()
    plain = grpo_token_loss(lp, served, adv, 0.2, 0.28)
    assert plain.ratio.tolist() == pytest.approx([1.2, 5.0, 0.5])
    assert plain.clipped.tolist() == [False, True, True]
    plain.loss.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-1.2, 0.0, 0.0])


def test_reward_modes():
    assert [shape_reward(r, "partial") for r in (0.0, 0.5, 1.0)] == [0.0, 0.5, 1.0]
    assert [shape_reward(r, "binary") for r in (0.0, 0.5, 0.999, 1.0)] == [0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="unknown reward mode"):
        shape_reward(1.0, "dense")


def test_sampled_entropy_is_the_mean_negative_logprob_of_generated_tokens_only():
    from rl.grpo import sampled_entropy
    from rl.types import TrainSample

    a = TrainSample([1, 2, 3, 4], [0, 1, 0, 1], [0.0, -0.5, -9.0, -1.5], 1.0)   # the tool token (-9) is not the policy's
    b = TrainSample([1, 2, 3], [0, 1, 1], [0.0, float("nan"), -1.0], -1.0)      # grammar-sampled: no served log-prob
    assert sampled_entropy([a, b]) == pytest.approx((0.5 + 1.5 + 1.0) / 3)
    assert sampled_entropy([TrainSample([1, 2], [0, 1], [0.0, float("nan")], 0.0)]) is None
