"""Learner on CPU: a tiny random llama for the step math, SmolLM2-135M for the save paths."""
import math
import random

import pytest
import torch

from actors.learner import Learner
from modeling.packing import micro_batches
from modeling.precision import cpu_has_bf16
from rl.config import LearnerConfig, LoraConfig, ModelConfig
from rl.types import TrainSample
from tests.fixtures.models import VOCAB, qwen35


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


LORA = LoraConfig(rank=4, alpha=8)
ALL_LINEAR = LoraConfig(rank=4, alpha=8, target_modules=["all-linear"])


def make_cfg(**kw) -> LearnerConfig:
    base = dict(lr=5e-2, logit_chunk_tokens=16, micro_batch_tokens=4096)
    base.update(kw)
    return LearnerConfig(**base)


def make_samples(n=4, seed=0, vocab=VOCAB) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(12, 30)
        prompt = rng.randint(3, 8)
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [0] * prompt + [1] * (length - prompt)
        lps = [0.0] * prompt + [-rng.uniform(3.0, 6.0) for _ in range(length - prompt)]
        out.append(TrainSample(ids, mask, lps, advantage=1.0 if i % 2 == 0 else -1.0, group_id=str(i // 2)))
    return out


def lora(learner) -> dict:
    return learner.lora_state()


def assert_same_lora(a: dict, b: dict, rtol=1e-4, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)


EPS32 = torch.finfo(torch.float32).eps


def assert_same_gradients(a: Learner, b: Learner, summed_terms: float, slack: float = 8.0):
    """The step's gradients (before the optimizer) agree up to float32 reassociation.

    Two ways of computing one step (chunks, micro-batches, tiles, segments) sum the same terms
    in another order. Rounding errors of n summed terms add up like a random walk, about
    eps32 * sqrt(n) relative to the terms' scale; `slack` times that, relative to each tensor's
    largest element, is the tolerance (measured: at most ~2 * eps32 * sqrt(n) on these tests).
    A real difference (a wrong boundary, a dropped token) is orders of magnitude larger.
    Weights after an Adam step are no test: Adam moves every element by about ±lr whatever
    its gradient's size, so a near-zero gradient whose sign flips moves by up to 2 * lr.
    """
    ga, gb = a.last_gradients(), b.last_gradients()
    assert ga.keys() == gb.keys() and ga
    bound = slack * EPS32 * math.sqrt(summed_terms)
    assert any(g.abs().max() > 0 for g in ga.values()), "the step had no gradient"
    for k in ga:
        scale = ga[k].abs().max().item()
        err = (ga[k] - gb[k]).abs().max().item()
        assert err <= bound * scale, f"{k}: max |Δgrad| {err:.3g} > {bound:.3g} × scale {scale:.3g}"


def test_micro_batches_respect_budget_and_keep_everything():
    samples = make_samples(9)
    batches = micro_batches(samples, 60)
    assert [s for b in batches for s in b] == samples
    for b in batches:
        assert len(b) == 1 or max(len(s.token_ids) for s in b) * len(b) <= 60


def test_sequence_logprobs_match_hf_logits(tiny_model_path):
    from transformers import AutoModelForCausalLM

    learner = Learner(tiny_model_path, make_cfg(), ModelConfig(), seed=0, lora=LORA)
    ids = make_samples(1)[0].token_ids
    got = learner.sequence_logprobs(ids)
    ref_model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = ref_model(torch.tensor([ids])).logits[0, :-1]
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    assert got[0] == 0.0 and len(got) == len(ids)
    torch.testing.assert_close(torch.tensor(got[1:]), ref, rtol=1e-5, atol=1e-5)


def test_chunked_and_naive_steps_agree(tiny_model_path):
    samples = make_samples()
    a = Learner(tiny_model_path, make_cfg(loss_impl="chunked"), ModelConfig(), seed=0, lora=LORA)
    b = Learner(tiny_model_path, make_cfg(loss_impl="naive"), ModelConfig(), seed=0, lora=LORA)
    ma, mb = a.train_step(samples), b.train_step(samples)
    for k in ("loss", "grad_norm", "clip_frac", "ratio_mean", "tokens"):
        assert ma[k] == pytest.approx(mb[k], rel=1e-4, abs=1e-6), k
    assert ma["tokens"] == sum(sum(s.loss_mask) for s in samples)
    assert ma["grad_norm"] > 0 and ma["peak_mem_gib"] > 0
    assert_same_gradients(a, b, ma["tokens"])


def test_micro_batching_does_not_change_the_step(tiny_model_path):
    """Token-level aggregation over the whole batch: splitting into micro-batches is invisible."""
    samples = make_samples(5)
    whole = Learner(tiny_model_path, make_cfg(micro_batch_tokens=4096), ModelConfig(), seed=0, lora=LORA)
    split = Learner(tiny_model_path, make_cfg(micro_batch_tokens=32), ModelConfig(), seed=0, lora=LORA)
    mw, ms = whole.train_step(samples), split.train_step(samples)
    assert mw["loss"] == pytest.approx(ms["loss"], rel=1e-4)
    assert mw["grad_norm"] == pytest.approx(ms["grad_norm"], rel=1e-4)
    assert_same_gradients(whole, split, mw["tokens"])


def test_loss_options_in_the_learner(tiny_model_path):
    """seq_mean weighs sequences alike (and still ignores micro-batching); tis_cap weighs tokens by
    the learner/served probability ratio, capped, and reports it."""
    samples = make_samples(5)
    token = Learner(tiny_model_path, make_cfg(), ModelConfig(), seed=0, lora=LORA).train_step(samples)
    seq = Learner(tiny_model_path, make_cfg(loss_agg="seq_mean"), ModelConfig(), seed=0, lora=LORA)
    seq_split = Learner(tiny_model_path, make_cfg(loss_agg="seq_mean", micro_batch_tokens=32), ModelConfig(), seed=0,
                        lora=LORA)
    ms, mss = seq.train_step(samples), seq_split.train_step(samples)
    assert ms["loss"] == pytest.approx(mss["loss"], rel=1e-4) and ms["loss"] != pytest.approx(token["loss"], rel=1e-3)
    assert_same_gradients(seq, seq_split, ms["tokens"])
    tis = Learner(tiny_model_path, make_cfg(tis_cap=2.0), ModelConfig(), seed=0, lora=LORA).train_step(samples)
    # the samples' served log-probs (-3..-6) are far below a random model's (~-4.85 = ln 1/128 on average)
    assert 0 < tis["tis_weight_mean"] <= 2.0 and 0 < tis["tis_capped_frac"] < 1
    assert tis["ratio_mean"] == pytest.approx(1.0) and tis["clip_frac"] == 0.0
    assert tis["loss"] != pytest.approx(token["loss"], rel=1e-3)


def test_memory_options_do_not_change_the_step(tiny_model_path):
    samples = make_samples(3)
    plain = Learner(tiny_model_path, make_cfg(), ModelConfig(), seed=0, lora=LORA)
    saver = Learner(tiny_model_path, make_cfg(activation_offload=True, mlp_tile_tokens=5), ModelConfig(), seed=0,
                    lora=LORA)
    mp, msv = plain.train_step(samples), saver.train_step(samples)
    assert mp["grad_norm"] == pytest.approx(msv["grad_norm"], rel=1e-4)
    assert_same_gradients(plain, saver, mp["tokens"])


@pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has neither AMX nor AVX512-BF16")
def test_cpu_bf16_autocast_takes_the_same_step_and_keeps_the_probe_fp32(tiny_model_path):
    """learner.cpu_bf16: the update's matmuls run in bf16, so its loss and gradient differ from fp32
    only by bf16 rounding; the weights stay fp32 and the parity probe's log-probs are fp32 ones."""
    samples = make_samples(4)
    fp32 = Learner(tiny_model_path, make_cfg(), ModelConfig(), seed=0, lora=LORA)
    bf16 = Learner(tiny_model_path, make_cfg(cpu_bf16=True), ModelConfig(), seed=0, lora=LORA)
    probe = samples[0].token_ids
    assert bf16.sequence_logprobs(probe) == fp32.sequence_logprobs(probe)
    m32, m16 = fp32.train_step(samples), bf16.train_step(samples)
    assert m16["loss"] == pytest.approx(m32["loss"], rel=0.05, abs=1e-3)
    assert m16["grad_norm"] == pytest.approx(m32["grad_norm"], rel=0.05)
    assert m16["grad_norm"] != m32["grad_norm"]  # the autocast really ran
    assert all(p.dtype == torch.float32 for p in bf16.params)
    g32 = torch.cat([p.grad.reshape(-1) for p in fp32.params])
    g16 = torch.cat([p.grad.reshape(-1) for p in bf16.params])
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99


def test_training_moves_logprobs_in_the_advantage_direction(tiny_model_path):
    learner = Learner(tiny_model_path, make_cfg(lr=2e-2), ModelConfig(), seed=0, lora=LORA)
    good, bad = make_samples(2, seed=3)
    good.advantage, bad.advantage = 1.0, -1.0
    for s in (good, bad):  # on-policy rollout log-probs
        s.logprobs = [lp if m else 0.0 for lp, m in zip(learner.sequence_logprobs(s.token_ids), s.loss_mask)]

    def masked_sum(s):
        return sum(lp for lp, m in zip(learner.sequence_logprobs(s.token_ids), s.loss_mask) if m)

    before = masked_sum(good), masked_sum(bad)
    first = learner.train_step([good, bad])
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and first["clip_frac"] == 0.0
    for _ in range(2):
        learner.train_step([good, bad])
    after = masked_sum(good), masked_sum(bad)
    assert after[0] > before[0] + 0.5
    assert after[1] < before[1] - 0.5


@pytest.mark.parametrize("pack", [False, True])
def test_logprobs_left_to_the_learner_equal_recording_its_own(tiny_model_path, pack):
    """A guided call's tokens carry LEARNER_LOGPROB: the step must equal one whose rollout
    log-probs were the learner's own (what a second scoring pass on the same weights gives)."""
    from rl.types import LEARNER_LOGPROB
    layout = "packed" if pack else "padded"
    left = Learner(tiny_model_path, make_cfg(layout=layout), ModelConfig(), seed=0, lora=LORA)
    recorded = Learner(tiny_model_path, make_cfg(layout=layout), ModelConfig(), seed=0, lora=LORA)
    a, b = make_samples(3, seed=5), make_samples(3, seed=5)
    for s in a:
        s.logprobs = [LEARNER_LOGPROB if m else 0.0 for m in s.loss_mask]
    for s in b:
        s.logprobs = [lp if m else 0.0 for lp, m in zip(recorded.sequence_logprobs(s.token_ids), s.loss_mask)]
    ma, mb = left.train_step(a), recorded.train_step(b)
    assert ma["ratio_mean"] == 1.0 and ma["clip_frac"] == 0.0
    assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-4, abs=1e-6)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-3)
    assert_same_lora(lora(left), lora(recorded), rtol=1e-3, atol=1e-5)


def test_kl_is_zero_before_any_update_and_positive_after(tiny_model_path):
    learner = Learner(tiny_model_path, make_cfg(beta=0.1), ModelConfig(), seed=0, lora=LORA)
    samples = make_samples(2)
    m1 = learner.train_step(samples)
    assert m1["kl"] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at zero: policy == reference
    m2 = learner.train_step(samples)
    assert m2["kl"] > 0


def test_bad_input_raises_and_changes_nothing(tiny_model_path):
    learner = Learner(tiny_model_path, make_cfg(), ModelConfig(), seed=0, lora=LORA)
    before = lora(learner)
    bad = make_samples(1)[0]
    bad.token_ids[3] = VOCAB + 5
    with pytest.raises(ValueError, match="outside the vocabulary"):
        learner.train_step(make_samples(2) + [bad])
    no_tokens = TrainSample([1, 2, 3], [0, 0, 0], [0.0, 0.0, 0.0], advantage=1.0)
    with pytest.raises(ValueError, match="no trained tokens"):
        learner.train_step([no_tokens])
    assert_same_lora(before, lora(learner), rtol=0, atol=0)
    assert learner.steps_done == 0


def test_save_and_load_state_resumes_exactly(tiny_model_path, tmp_path):
    s1, s2 = make_samples(3, seed=1), make_samples(3, seed=2)
    a = Learner(tiny_model_path, make_cfg(), ModelConfig(), seed=0, lora=LORA)
    a.train_step(s1)
    a.save_state(str(tmp_path / "ckpt"))
    a.train_step(s2)
    # different init, overwritten by the load
    b = Learner(tiny_model_path, make_cfg(), ModelConfig(), seed=123, lora=LORA)
    b.load_state(str(tmp_path / "ckpt"))
    assert b.steps_done == 1
    b.train_step(s2)
    assert_same_lora(lora(a), lora(b), rtol=1e-6, atol=1e-7)
    with pytest.raises(FileNotFoundError, match="incomplete"):
        b.load_state(str(tmp_path / "nothing-here"))


def test_saved_adapter_and_merged_model_reproduce_the_policy(tmp_path):
    """On the real SmolLM2-135M: both save formats load back to the learner's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modeling.default_model import resolve_model_path

    path = resolve_model_path("default")
    learner = Learner(path, make_cfg(lr=1e-2, logit_chunk_tokens=64), ModelConfig(), seed=0, lora=LORA)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("def add(a, b):\n    return a + b\n")["input_ids"]
    on_policy = learner.sequence_logprobs(ids)
    sample = TrainSample(ids, [0] * 4 + [1] * (len(ids) - 4), [0.0] * 4 + on_policy[4:], advantage=1.0)
    for _ in range(2):
        learner.train_step([sample])
    want = torch.tensor(learner.sequence_logprobs(ids)[1:])

    def logprobs(model):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)

    merged_dir = learner.save_merged(str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    torch.testing.assert_close(logprobs(merged), want, rtol=1e-4, atol=1e-4)
    assert AutoTokenizer.from_pretrained(merged_dir)(["x"])["input_ids"]  # tokenizer files travel along

    adapter_dir = learner.save_adapter(str(tmp_path / "adapter"))
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter_dir)
    torch.testing.assert_close(logprobs(with_adapter), want, rtol=1e-4, atol=1e-4)
    # the step really moved the policy away from the base model
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert (logprobs(plain) - want).abs().max() > 1e-3


def test_linear_attention_segments_and_mlp_tiles_match_plain_step_on_qwen35(monkeypatch):
    """Qwen3.5 hybrid shape (Gated-DeltaNet + attention), tiny: the memory savers change no numbers."""
    import modeling.learner_memory as lm

    calls = {"segment": 0, "tile": 0}
    real_checkpoint, real_apply = lm.checkpoint, lm._TiledMLP.apply

    def counting_checkpoint(*a, **kw):
        calls["segment"] += 1
        return real_checkpoint(*a, **kw)

    def counting_apply(*a):
        calls["tile"] += 1
        return real_apply(*a)

    monkeypatch.setattr(lm, "checkpoint", counting_checkpoint)
    monkeypatch.setattr(lm._TiledMLP, "apply", counting_apply)


    rng = random.Random(0)
    ids = [rng.randrange(VOCAB) for _ in range(300)]
    sample = TrainSample(ids, [0] * 10 + [1] * 290, [0.0] * 10 + [-5.0] * 290, advantage=1.0)
    plain = Learner("", make_cfg(), ModelConfig(), seed=0, lora=ALL_LINEAR, base_model=qwen35())
    saver = Learner("", make_cfg(linear_attn_segment_tokens=64, mlp_tile_tokens=50, activation_offload=True),
                    ModelConfig(), seed=0, lora=ALL_LINEAR, base_model=qwen35())
    mp = plain.train_step([sample])
    assert calls == {"segment": 0, "tile": 0}
    ms = saver.train_step([sample])
    assert calls["segment"] >= 3 * 5 and calls["tile"] >= 4  # 3 delta-rule layers x 5 segments; 4 MLPs
    assert mp["loss"] == pytest.approx(ms["loss"], rel=1e-6)
    assert mp["grad_norm"] == pytest.approx(ms["grad_norm"], rel=1e-5) and mp["grad_norm"] > 0
    assert_same_gradients(plain, saver, mp["tokens"])
    with pytest.raises(ValueError, match="multiple of 64"):
        Learner("", make_cfg(linear_attn_segment_tokens=100), ModelConfig(), seed=0, lora=LORA, base_model=qwen35())
