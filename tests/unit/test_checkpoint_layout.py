"""The real Qwen3.5 layout (Qwen3_5ForConditionalGeneration, a vision tower beside the LM under
`model.language_model.`): the learner trains the text part, and what it hands the engine goes
back under the checkpoint's own names. CPU, a tiny random checkpoint built in seconds."""
import json
import random

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from actors.learner import Learner
from modeling.checkpoint_layout import CheckpointLayout
from rl.config import LearnerConfig, LoraConfig, ModelConfig
from rl.types import TrainSample
from tests.fixtures.qwen35_checkpoint import build


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen35-cg")
    build(out, "tiny", dtype="float32", end_token_p=0.1)
    return str(out)


def _samples(vocab: int, n: int = 3) -> list[TrainSample]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        ids = [rng.randrange(vocab) for _ in range(20)]
        mask = [0] * 6 + [1] * 14
        out.append(TrainSample(ids, mask, [-3.0] * 20, advantage=1.0 if i % 2 else -1.0, group_id="g"))
    return out


def _learner(path: str) -> Learner:
    cfg = LearnerConfig(lr=5e-2, logit_chunk_tokens=16, fast_kernels="off")
    return Learner(path, cfg, ModelConfig(dtype="float32"), seed=0, lora=LoraConfig(rank=4, alpha=8))


def test_layout_reads_the_shipped_config(checkpoint):
    layout = CheckpointLayout.of(checkpoint)
    assert layout.architecture == "Qwen3_5ForConditionalGeneration" and layout.multimodal
    assert layout.hybrid_linear_attention
    assert layout.engine_kwargs(on_gpu=True) == {"language_model_only": True, "gdn_prefill_backend": "triton"}
    assert layout.engine_kwargs(on_gpu=False) == {"language_model_only": True}
    key = "model.layers.3.self_attn.q_proj.weight"
    assert layout.to_checkpoint_key(key) == "model.language_model.layers.3.self_attn.q_proj.weight"
    assert layout.to_text_key(layout.to_checkpoint_key(key)) == key
    assert layout.to_checkpoint_key("lm_head.weight") == "lm_head.weight"
    text_only = CheckpointLayout.from_config({"architectures": ["LlamaForCausalLM"]})
    assert text_only.to_checkpoint_key(key) == key and text_only.engine_kwargs(on_gpu=True) == {}


def test_learner_loads_the_text_part_with_the_shipped_weights(checkpoint):
    learner = _learner(checkpoint)
    base = learner.model.get_base_model()
    assert type(base).__name__ == "Qwen3_5ForCausalLM"
    with safe_open(f"{checkpoint}/model.safetensors", "pt") as f:
        shipped = f.get_tensor("model.language_model.layers.0.linear_attn.in_proj_qkv.weight")
    loaded = base.model.layers[0].linear_attn.in_proj_qkv.weight.detach()
    assert torch.equal(shipped, loaded)


def test_merged_sync_and_adapter_go_back_under_the_checkpoint_names(checkpoint, tmp_path):
    from transformers import Qwen3_5ForConditionalGeneration

    learner = _learner(checkpoint)
    vocab = learner.lm_head.weight.shape[0]
    learner.train_step(_samples(vocab))
    probe = list(range(3, 40))
    want = learner.sequence_logprobs(probe)

    merged = learner.save_merged(str(tmp_path / "merged"))
    config = json.loads(open(f"{merged}/config.json").read())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    keys = set(load_file(f"{merged}/model.safetensors"))
    assert "model.language_model.layers.3.self_attn.q_proj.weight" in keys
    assert not any(k.startswith("model.layers.") for k in keys)
    # the merged folder, loaded as the checkpoint's own architecture, scores like the learner
    served = Qwen3_5ForConditionalGeneration.from_pretrained(merged, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = served(input_ids=torch.tensor([probe])).logits[0].log_softmax(-1)
    got = [0.0] + [logits[i, t].item() for i, t in enumerate(probe[1:])]
    assert max(abs(a - b) for a, b in zip(want, got)) < 1e-4

    adapter = learner.save_adapter(str(tmp_path / "adapter"))
    akeys = set(load_file(f"{adapter}/adapter_model.safetensors"))
    assert any(k.startswith("base_model.model.model.language_model.layers.3.self_attn.q_proj.lora_A") for k in akeys)
    assert not any(k.startswith("base_model.model.model.layers.") for k in akeys)

    # a checkpoint (adapter under the checkpoint's names) resumes into a fresh learner
    learner.save_state(str(tmp_path / "state"))
    again = _learner(checkpoint)
    again.load_state(str(tmp_path / "state"))
    assert max(abs(a - b) for a, b in zip(want, again.sequence_logprobs(probe))) < 1e-5


def test_random_checkpoint_samples_its_end_token(checkpoint):
    """The raised end token makes a random model's completion lengths vary (the length reward needs that)."""
    info = json.loads(open(f"{checkpoint}/random_checkpoint.json").read())
    assert info["end_token_scale"] > 1
