"""Where a checkpoint keeps its language model, and what the serving engine must be told.

Qwen3.5 ships as `Qwen3_5ForConditionalGeneration`: a vision tower beside the language model,
whose weights live under `model.language_model.` (the LM head stays `lm_head.`). The learner
trains the text part only (transformers loads it from such a folder as `Qwen3_5ForCausalLM`,
keys `model.layers.…`), while vLLM serves the folder as shipped, text-only
(`language_model_only=True`). Whatever the learner hands the engine (merged weights, a LoRA
adapter) therefore goes back under the checkpoint's own names and config; a text-only
folder needs no mapping.

    layout = CheckpointLayout.of(model_path)
    layout.to_checkpoint_key("model.layers.0.mlp.up_proj.weight")
    # -> "model.language_model.layers.0.mlp.up_proj.weight"
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TEXT_PREFIX = "model."              # the learner's (text model's) body
LANGUAGE_MODEL = "language_model."  # inserted after TEXT_PREFIX in a multimodal checkpoint
ADAPTER_PREFIX = "base_model.model."  # PEFT's prefix on adapter keys


@dataclass(frozen=True)
class CheckpointLayout:
    architecture: str
    multimodal: bool        # a vision tower beside the LM: weights under model.language_model.
    hybrid_linear_attention: bool  # Gated-DeltaNet layers (Qwen3.5 / Qwen3-Next)
    config: dict

    @classmethod
    def of(cls, model_path: str | Path) -> "CheckpointLayout":
        path = Path(model_path) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_path!r} is not a Hugging Face model folder (no config.json)")
        config = json.loads(path.read_text())
        return cls.from_config(config)

    @classmethod
    def from_config(cls, config: dict) -> "CheckpointLayout":
        archs = config.get("architectures") or [""]
        text = config.get("text_config") or config
        layer_types = text.get("layer_types") or []
        return cls(architecture=archs[0],
                   multimodal=archs[0].endswith("ForConditionalGeneration") and "text_config" in config,
                   hybrid_linear_attention="linear_attention" in layer_types,
                   config=config)

    # ---- names ------------------------------------------------------------------------------
    def to_checkpoint_key(self, key: str) -> str:
        """A text model's state-dict key -> the key this checkpoint stores it under."""
        if self.multimodal and key.startswith(TEXT_PREFIX) and not key.startswith(TEXT_PREFIX + LANGUAGE_MODEL):
            return TEXT_PREFIX + LANGUAGE_MODEL + key[len(TEXT_PREFIX):]
        return key

    def to_text_key(self, key: str) -> str:
        """Inverse of to_checkpoint_key."""
        full = TEXT_PREFIX + LANGUAGE_MODEL
        if self.multimodal and key.startswith(full):
            return TEXT_PREFIX + key[len(full):]
        return key

    def to_checkpoint_adapter_key(self, key: str) -> str:
        """A PEFT adapter key of the text model -> the name a server of this checkpoint expects."""
        if key.startswith(ADAPTER_PREFIX):
            return ADAPTER_PREFIX + self.to_checkpoint_key(key[len(ADAPTER_PREFIX):])
        return key

    def to_text_adapter_key(self, key: str) -> str:
        if key.startswith(ADAPTER_PREFIX):
            return ADAPTER_PREFIX + self.to_text_key(key[len(ADAPTER_PREFIX):])
        return key

    # ---- serving ----------------------------------------------------------------------------
    def engine_kwargs(self, on_gpu: bool) -> dict:
        """vLLM EngineArgs this checkpoint needs: text-only serving of a multimodal folder, and the
        Triton Gated-DeltaNet prefill on GPU (the sm90 default, FlashInfer, JIT-compiles for minutes)."""
        kw: dict = {}
        if self.multimodal:
            kw["language_model_only"] = True
        if self.hybrid_linear_attention and on_gpu:
            kw["gdn_prefill_backend"] = "triton"
        return kw
