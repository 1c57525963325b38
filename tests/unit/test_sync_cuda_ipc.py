"""sync.strategy=cuda_ipc on CPU: the config rules, the bucket plan, the merge arithmetic and the
order of the driver's chained calls (the IPC hand-over itself is a `gpu` test in test_gpu.py)."""
import pytest

from actors.sync_cuda_ipc import CudaIpcSync, MergedBuckets, plan_buckets
from rl.config import ConfigError, RolloutConfig, load_config

RECIPE = "configs/qwen35_4b_24gb.yaml"


def test_bucket_plan_keeps_order_and_size():
    assert plan_buckets([10, 10, 10], 25) == [[0, 1], [2]]
    assert plan_buckets([30, 5, 5, 30], 25) == [[0], [1, 2], [3]]  # a tensor larger than a bucket goes alone
    assert plan_buckets([], 25) == []
    assert sum(plan_buckets([7] * 100, 64), []) == list(range(100))


@pytest.mark.parametrize("override, names", [
    ("rollout.sleep_level=2", "rollout.sleep_level=1"),
    ("rollout.num_gpus=0", "rollout.num_gpus"),
    ("ray.placement_strategy=SPREAD", "sync.strategy=merged"),
])
def test_cuda_ipc_config_refuses_what_cannot_work(override, names):
    assert load_config(RECIPE).sync.strategy == "cuda_ipc"
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_config(RECIPE, [override])


def test_today_recipe_still_loads_with_its_overrides():
    cfg = load_config(RECIPE, ["rollout.enforce_eager=true", "sync.strategy=lora"])
    assert cfg.rollout.eager(on_gpu=True) == (True, "rollout.enforce_eager=true")


def test_enforce_eager_auto_is_graphs_on_gpu_eager_on_cpu():
    r = RolloutConfig()
    assert r.enforce_eager == "auto"
    assert r.eager(on_gpu=True)[0] is False and r.eager(on_gpu=False)[0] is True
    assert RolloutConfig(enforce_eager=False).eager(on_gpu=False)[0] is False
    with pytest.raises(ValueError):
        RolloutConfig(enforce_eager="sometimes")


def test_compile_cache_lives_under_rlvr_home_on_gpu_only(monkeypatch, tmp_path):
    from actors.engine import engine_env_vars
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    assert engine_env_vars(RolloutConfig(num_gpus=0.5), 1)["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm-cache")
    assert "VLLM_CACHE_ROOT" not in engine_env_vars(RolloutConfig(), 1)


def test_make_weight_sync_picks_the_ipc_module():
    from orchestrator.weight_sync import make_weight_sync
    sync = make_weight_sync("cuda_ipc", "unused", bucket_mib=64)
    assert isinstance(sync, CudaIpcSync) and sync.bucket_bytes == 64 << 20
    with pytest.raises(ValueError, match="merged_on_engine, cuda_ipc"):
        make_weight_sync("telepathy", "unused")


def _tiny_peft():
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    for name, p in model.named_parameters():  # a trained adapter: B is no longer zero
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model


def test_merged_buckets_hold_w_plus_scaled_ba_under_checkpoint_names():
    import torch
    model = _tiny_peft()
    buckets = MergedBuckets(model, None, bucket_bytes=32 * 32 * 4 + 1)  # one q_proj (fp32) per bucket at most
    keys = [k for k, _ in buckets.layers]
    assert keys == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
                    "model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    assert len(buckets.buckets) == 4
    model.merge_adapter()  # PEFT's own merge is the reference
    want = {k.replace(".base_layer", ""): v.clone() for k, v in model.get_base_model().state_dict().items()}
    model.unmerge_adapter()
    for i in range(len(buckets.buckets)):
        flat, meta = buckets.merged(i)
        for key, offset, shape in meta:
            got = flat[offset:offset + torch.Size(shape).numel()].view(shape)
            assert torch.allclose(got, want[key], atol=1e-6), key
            assert not torch.equal(got, model.get_base_model().state_dict()[key.replace(".weight", ".base_layer.weight")])


class _Actor:
    """Records .method.remote(*args) calls in order; each returns a token naming the call."""

    def __init__(self, name, log, results=None):
        self.name, self.log, self.results = name, log, results or {}

    def __getattr__(self, method):
        actor = self

        class _Method:
            @staticmethod
            def remote(*args):
                token = f"{actor.name}.{method}#{len(actor.log)}"
                actor.log.append((token, args))
                return actor.results.get(method, token)
        return _Method


def test_driver_chains_every_bucket_before_the_engines_finish(monkeypatch):
    import types
    log: list = []
    fake_ray = types.SimpleNamespace(get=lambda refs: ["gpu-0"] * len(refs) if isinstance(refs, list) else 2)
    monkeypatch.setitem(__import__("sys").modules, "ray", fake_ray)
    rank0 = _Actor("learner", log)
    workers = [_Actor("w0", log), _Actor("w1", log)]
    refs = CudaIpcSync(bucket_mib=1).start(types.SimpleNamespace(actors=[rank0]), workers, step=1)
    calls = [t.split("#")[0] for t, _ in log]
    assert calls[:4] == ["learner.gpu_uuid", "w0.gpu_uuid", "w1.gpu_uuid", "learner.ipc_plan"]
    assert calls[4:] == ["learner.ipc_bucket", "w0.install_ipc_bucket", "w1.install_ipc_bucket", "learner.ipc_release",
                         "learner.ipc_bucket", "w0.install_ipc_bucket", "w1.install_ipc_bucket", "learner.ipc_release",
                         "w0.finish_ipc_sync", "w1.finish_ipc_sync"]
    by_token = dict(log)
    release = [t for t, _ in log if ".ipc_release" in t]
    assert by_token[release[0]] == tuple(t for t, _ in log[5:7])  # the release waits for both installs
    assert all(by_token[r] == tuple(release) for r in refs)  # each engine finishes after every release


def test_driver_refuses_an_engine_on_another_gpu(monkeypatch):
    import types
    fake_ray = types.SimpleNamespace(get=lambda refs: ["gpu-0", "gpu-1"])
    monkeypatch.setitem(__import__("sys").modules, "ray", fake_ray)
    with pytest.raises(RuntimeError, match="not on the learner's GPU"):
        CudaIpcSync().start(types.SimpleNamespace(actors=[_Actor("learner", [])]), [_Actor("w0", [])], step=1)
