import math

import pytest
import torch

from rl.fused_logprob import chunked_target_logprobs, naive_target_logprobs
from rl.grpo import frac_zero_std_groups, group_advantages, grpo_token_loss


def test_group_advantages_hand_numbers():
    rewards = [1.0, 0.0, 0.5, 0.5, 2.0, 4.0]
    groups = ["a", "a", "b", "b", "c", "c"]
    adv = group_advantages(rewards, groups, eps=0.0)
    assert adv[:2] == pytest.approx([1.0, -1.0])       # mean 0.5, population std 0.5
    assert adv[2:4] == [0.0, 0.0]                       # zero-std group -> exact zeros
    assert adv[4:] == pytest.approx([-1.0, 1.0])
    assert frac_zero_std_groups(rewards, groups) == pytest.approx(1 / 3)
    assert frac_zero_std_groups([], []) == 0.0


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
