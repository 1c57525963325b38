"""Tiny random models the learner tests share (no download, built in a second)."""
from __future__ import annotations

import torch

VOCAB = 128


def qwen35():
    """The Qwen3.5 hybrid shape (3 Gated-DeltaNet layers + 1 attention layer), tiny, seeded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "qwen3_5_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"])
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
