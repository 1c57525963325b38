"""Fast Gated-DeltaNet path (modeling.fast_kernels): the CPU side here, the kernels themselves under `gpu`."""
import importlib.util
import logging

import pytest
import torch

from modeling.fast_kernels import check_kernels, enable_fast_kernels, make_causal_conv, make_delta_rule
from tests.fixtures.models import qwen35


def _reference_fns():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    from modeling.fast_kernels import _reference
    return _reference(m.torch_chunk_gated_delta_rule), _reference(m.causal_conv1d_fn)


def test_check_harness_passes_the_reference_against_itself_on_cpu():
    rd, rc = _reference_fns()
    got = check_kernels(make_delta_rule(rd, None), make_causal_conv(rc, None), rd, rc, heads=2, k_dim=16,
                        v_dim=16, device=torch.device("cpu"), lengths=(40, 70))
    assert max(v for k, v in got.items() if k != "o_max_abs") < 2e-2  # bf16 inputs against fp32, same function


def test_no_cuda_falls_back_with_a_log_line(caplog):
    model = qwen35()
    with caplog.at_level(logging.WARNING, logger="modeling.fast_kernels"):
        res = enable_fast_kernels(model, torch.device("cpu"))
    assert res["fast"] is False and "no CUDA" in res["reason"]
    assert "PyTorch reference kernels" in caplog.text


gpu = pytest.mark.gpu
needs_fla = pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("fla") is None,
                               reason="needs CUDA and flash-linear-attention")


@gpu
@needs_fla
def test_fla_path_passes_its_startup_check_on_qwen35_head_sizes():
    rd, rc = _reference_fns()
    from modeling.fast_kernels import CHECK_TOLERANCE, _load_fla

    fd, fc = _load_fla(128)
    got = check_kernels(make_delta_rule(rd, fd), make_causal_conv(rc, fc), rd, rc, heads=8, k_dim=128, v_dim=128,
                        device=torch.device("cuda"))
    assert max(v for k, v in got.items() if k != "o_max_abs") < CHECK_TOLERANCE, got


@pytest.mark.parametrize("where", ["learner", "sft"])
def test_off_means_pytorch_even_when_transformers_picked_another_kernel(monkeypatch, where):
    """With fla importable, transformers calls fla's kernels directly (and fla refuses its gated
    backward on Hopper with Triton < 3.7.1): `fast_kernels=off` must still train on the PyTorch path."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    from actors.learner import Learner
    from modeling.fast_kernels import _reference
    from modeling.sft import select_kernels
    from rl.config import LearnerConfig, LoraConfig, ModelConfig, WarmStartConfig
    from rl.types import TrainSample

    def picked(*args, **kwargs):
        raise RuntimeError("the kernel transformers picked was called")
    picked.__wrapped__ = _reference(m.torch_chunk_gated_delta_rule)
    monkeypatch.setattr(m, "torch_chunk_gated_delta_rule", picked)
    model = qwen35()
    if where == "sft":
        assert select_kernels(model, WarmStartConfig(fast_kernels="off"), cuda=False)["reason"] == \
            "learner.fast_kernels=off"
        model(torch.tensor([[1, 2, 3, 4, 5]])).logits.sum().backward()
        return
    learner = Learner("unused", LearnerConfig(fast_kernels="off"), ModelConfig(), seed=0,
                      lora=LoraConfig(rank=4, alpha=8), base_model=model)
    out = learner.train_step([TrainSample([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1], [-3.0] * 6, advantage=1.0,
                                          group_id="g")])
    assert out["tokens"] == 4
