"""Two Learner actors under real Ray with gloo: replicas agree and equal one learner on the whole batch."""
import os

import pytest
import torch

from rl.config import RunConfig
from rl.types import TrainSample
from tests.unit.test_learner import make_samples

VOCAB = 128


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("tiny-llama-dp")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]}})
    yield ray
    ray.shutdown()


def samples(n: int, seed: int) -> list[TrainSample]:
    return make_samples(n, seed)


def run_cfg(n: int) -> RunConfig:
    return RunConfig.model_validate({"learner": {
        "num_learners": n, "num_cpus": 1, "lr": 2e-2, "logit_chunk_tokens": 16, "micro_batch_tokens": 64},
        "lora": {"rank": 4, "alpha": 8}})


def test_split_by_tokens_balances_and_keeps_every_sample():
    from actors.learner_group import split_by_tokens

    batch = samples(9, seed=5)
    shards = split_by_tokens(batch, 2)
    assert sorted(id(s) for sh in shards for s in sh) == sorted(id(s) for s in batch)
    loads = [sum(len(s.token_ids) for s in sh) for sh in shards]
    assert abs(loads[0] - loads[1]) <= max(len(s.token_ids) for s in batch)


def test_group_replicas_agree_and_match_single_learner(ray_cluster, tiny_model_path, tmp_path):
    from actors.learner import Learner
    from orchestrator.cluster import spawn_learners

    ray = ray_cluster
    cfg = run_cfg(2)
    batches = [samples(6, seed=1), samples(5, seed=2)]
    group = spawn_learners(cfg, tiny_model_path)
    single = Learner(tiny_model_path, run_cfg(1).learner, cfg.model, seed=cfg.trainer.seed, lora=cfg.lora)
    try:
        init = ray.get(group.replica_refs("lora_state"))
        for k in init[0]:
            torch.testing.assert_close(init[0][k], init[1][k], rtol=0, atol=0)

        metrics = [group.train_step(batches[0])]
        expected = [single.train_step(batches[0])]
        # Gradients of the same first step (before the optimizer): the group sums its shards'
        # gradients in another order than one learner does, so they agree up to float32
        # reassociation (weights after Adam would not: see tests/unit/test_learner.py).
        grads = ray.get(group.replica_refs("last_gradients"))[0]
        for k, want in single.last_gradients().items():
            scale = want.abs().max().item()
            err = (grads[k] - want).abs().max().item()
            assert err <= 8 * torch.finfo(torch.float32).eps * expected[0]["tokens"] ** 0.5 * scale, k
        metrics.append(group.train_step(batches[1]))
        expected.append(single.train_step(batches[1]))
        for got, want in zip(metrics, expected):
            for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "tokens"):
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key

        rank0, rank1 = ray.get(group.replica_refs("lora_state"))
        moved = 0.0
        for k in rank0:
            torch.testing.assert_close(rank0[k], rank1[k], rtol=0, atol=0, msg=k)  # replicas identical
            moved = max(moved, (rank0[k] - init[0][k]).abs().max().item())
        assert moved > 1e-3  # the steps changed the LoRA

        ids = batches[0][0].token_ids
        torch.testing.assert_close(torch.tensor(group.sequence_logprobs(ids)),
                                   torch.tensor(single.sequence_logprobs(ids)), rtol=1e-4, atol=1e-5)
        adapter = group.save_adapter(str(tmp_path / "adapter"))
        assert os.path.isfile(os.path.join(adapter, "adapter_model.safetensors"))
        assert group.num_trainable_params() == single.num_trainable_params()
    finally:
        group.shutdown()


def test_a_group_of_one_is_one_actor_without_a_process_group(ray_cluster, tiny_model_path):
    from orchestrator.cluster import spawn_learners

    group = spawn_learners(run_cfg(1), tiny_model_path)
    try:
        assert group.world_size == 1 and len(group.actors) == 1
        metrics = group.train_step(samples(3, seed=4))
        assert metrics["tokens"] > 0 and group.num_trainable_params() > 0
    finally:
        group.shutdown()
