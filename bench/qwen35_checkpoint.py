"""A random-initialised Qwen3.5 checkpoint in the layout the real ones ship in.

`Qwen3_5ForConditionalGeneration`: the language model under `model.language_model.`, a
(small) vision tower under `model.visual.`, a tokenizer with the project's ChatML tool
template. The 4B shape stands in for Qwen3.5-4B where the weights cannot be downloaded
(memory, speed, the serving path); `tiny` is the same layout in a few MB for tests.

A random model almost never samples its end token (1 in ~250k per step), so a length reward
would see every completion run to max_tokens and no group would differ; `--end-token-p`
scales the end token's embedding row until it is sampled at about that rate per position
(measured on the length prompts), so completion lengths vary.

    python -m bench.qwen35_checkpoint --shape 4b --out /tmp/qwen35-4b --device cuda --end-token-p 0.1
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.learner_memory import QWEN35_4B

ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10], "mrope_interleaved": True}
# the 4B model's head sizes (vLLM's Triton kernels compile once for both), few and narrow layers
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4, tie_word_embeddings=True,
            max_position_embeddings=8192)
SHAPES = {"4b": QWEN35_4B, "tiny": TINY}
VISION = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, in_channels=3, patch_size=16,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=256)
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
TEMPLATE = Path(__file__).resolve().parent.parent / "modeling" / "templates" / "chatml_tools.jinja"


def tiny_tokenizer():
    """A byte-level BPE trained on the spot (ChatML specials, the project's tool template): no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox jumps over the lazy dog. def add(a, b): return a + b\n",
              "Say hi. Name a fruit. Is water wet? What is the capital of France?",
              '{"name": "read", "arguments": {"path": "a.py"}} <tool_call> </tool_call> <tools> </tools>'] * 40
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|im_end|>")


def load_tokenizer(src: str | None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src) if src else tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tok.chat_template = TEMPLATE.read_text()
    return tok


def build(out: str | Path, shape: str = "tiny", tokenizer: str | None = None, device: str = "cpu",
          dtype: str = "bfloat16", seed: int = 0, end_token_p: float | None = None) -> dict:
    """Write the checkpoint folder; returns what was built (sizes, the end-token scale)."""
    import torch
    from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer)
    text = dict(SHAPES[shape])
    text["vocab_size"] = max(text["vocab_size"], -(-len(tok) // 64) * 64)
    n = text["num_hidden_layers"]
    eos, bos = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|im_start|>")
    tcfg = Qwen3_5TextConfig(**text, rope_parameters=ROPE, bos_token_id=bos, eos_token_id=eos,
                             layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                          for i in range(n)])
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    cfg = Qwen3_5Config(text_config=tcfg.to_dict(), vision_config={**VISION, "out_hidden_size": tcfg.hidden_size},
                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                        tie_word_embeddings=text["tie_word_embeddings"])
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3_5ForConditionalGeneration(cfg).to(getattr(torch, dtype))
    scale = raise_end_token(model, tok, end_token_p) if end_token_p else None
    model.save_pretrained(out)
    save_processor(out, tok)
    tok.save_pretrained(out)
    GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=eos).save_pretrained(out)
    info = {"shape": shape, "params": sum(p.numel() for p in model.parameters()), "vocab_size": text["vocab_size"],
            "tokenizer": tokenizer or "tiny BPE", "end_token_scale": scale, "seconds": time.perf_counter() - t0}
    (Path(out) / "random_checkpoint.json").write_text(json.dumps(info, indent=1))
    return info


def save_processor(out, tok) -> bool:
    """The image/video processor files a shipped folder has (vLLM builds the processor for this
    architecture); needs torchvision, so a CPU venv without it writes none."""
    try:
        from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor
        processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(), video_processor=Qwen3VLVideoProcessor(),
                                     tokenizer=tok, chat_template=tok.chat_template)
    except ImportError:
        return False
    processor.save_pretrained(out)
    return True


def raise_end_token(model, tok, target_p: float) -> float:
    """Scale the end token's embedding row so its mean sampling probability over the length
    prompts' positions is about target_p; returns the scale."""
    import torch

    from rl.length_reward import LENGTH_PROMPTS

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    emb = model.get_output_embeddings().weight
    batch = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"] for p in LENGTH_PROMPTS]
    hidden = []
    with torch.no_grad():
        for ids in batch:
            x = torch.tensor([ids], device=emb.device)
            hidden.append(model.model(input_ids=x).last_hidden_state[0].float())
        h = torch.cat(hidden)
        logits = h @ emb.float().T
        eos_logit = logits[:, eos].clone()
        logits[:, eos] = float("-inf")
        rest = torch.logsumexp(logits, dim=-1)
        lo, hi = 0.0, 1000.0
        for _ in range(50):  # mean p is monotone in the scale once some eos logits are positive
            mid = (lo + hi) / 2
            p = torch.sigmoid(mid * eos_logit - rest).mean().item()
            lo, hi = (mid, hi) if p < target_p else (lo, mid)
        emb[eos].mul_(lo)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--tokenizer", help="tokenizer folder (default: a tiny BPE trained on the spot)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--end-token-p", type=float, help="raise the end token to about this probability per position")
    a = ap.parse_args()
    print(json.dumps(build(a.out, a.shape, a.tokenizer, a.device, a.dtype, end_token_p=a.end_token_p)))


if __name__ == "__main__":
    main()
