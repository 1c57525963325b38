"""Warm-start SFT: TRL's SFTTrainer on pre-tokenized rows, PEFT LoRA, then a merged model
folder that a GRPO config points at with `model.path`.

Rows arrive already rendered in the serving format (token ids + a mask that is 1 on the
model's own tokens, each turn's end token included), so TRL never re-renders them: the
dataset has `input_ids` and `assistant_masks`, from which TRL builds the labels (-100 where
the mask is 0). Training resumes from the last checkpoint in `out/trainer/`; the loss per
logging step goes to `out/sft_log.jsonl` and the console.

    merged = run_sft(rows, model_path, WarmStartConfig(), out_dir)   # -> out_dir/model
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from modeling.precision import cpu_has_bf16
from rl.config import LoraConfig, ModelConfig, WarmStartConfig
from rl.jsonl import append_durable, read_complete

MODEL_DIR = "model"
ADAPTER_DIR = "adapter"     # the LoRA alone, bf16 (~10 MB for the 135M model): what a warm-start ships
DONE_FILE = "sft_done.json"


def select_kernels(model, cfg: WarmStartConfig, cuda: bool) -> dict:
    """The learner's Gated-DeltaNet kernel choice for the SFT model (a no-op for other models):
    left alone, transformers calls fla's kernels whenever fla is importable, unchecked."""
    import torch

    from modeling.fast_kernels import enable_fast_kernels

    res = enable_fast_kernels(model, torch.device("cuda" if cuda else "cpu"), required=cfg.fast_kernels == "on",
                              fast=cfg.fast_kernels != "off")
    if res["reason"] != "no Gated-DeltaNet layers":
        print(f"[sft] Gated-DeltaNet kernels: {'fla' if res['fast'] else 'PyTorch'} ({res['reason']})", flush=True)
    return res


def _last_checkpoint(trainer_dir: Path) -> str | None:
    ckpts = sorted(trainer_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return str(ckpts[-1]) if ckpts else None


def _has_field(cls, name: str) -> bool:
    import dataclasses

    return any(f.name == name for f in dataclasses.fields(cls))


def _sft_args(cfg: WarmStartConfig, trainer_dir: Path, cuda: bool, bf16: bool):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(trainer_dir), num_train_epochs=cfg.epochs, learning_rate=cfg.lr,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        lr_scheduler_type="cosine", warmup_steps=0.05, logging_steps=1, save_strategy="steps",
        save_steps=cfg.save_steps, save_total_limit=2, report_to=[], seed=cfg.seed,
        max_length=cfg.max_length, use_cpu=not cuda, bf16=bf16,
        gradient_checkpointing=cfg.gradient_checkpointing, activation_offloading=cfg.activation_offload,
        dataloader_num_workers=0,
        # rows of like length share a padded batch (packing needs FlashAttention's varlen kernels)
        **({"train_sampling_strategy": "group_by_length"} if cfg.batch_size > 1 and _has_field(SFTConfig,
                                                                                              "train_sampling_strategy") else {}),
        disable_tqdm=False, remove_unused_columns=True)


def save_adapter(peft_model, folder: Path, base: str) -> Path:
    """The trained LoRA factors in bf16, with the base model.path beside them
    (modeling.default_model.resolve_model_path merges such a folder onto its base)."""
    import torch

    from modeling.default_model import ADAPTER_BASE_FILE

    state = {k: v.detach().to(torch.bfloat16).cpu() for k, v in peft_model.state_dict().items() if "lora_" in k}
    peft_model.save_pretrained(folder, state_dict=state, safe_serialization=True)
    (folder / ADAPTER_BASE_FILE).write_text(base + "\n")
    return folder


def run_sft(rows: list[dict], model_path: str, cfg: WarmStartConfig, out_dir: str | Path,
            model_cfg: ModelConfig | None = None, lora: LoraConfig | None = None) -> Path:
    """Train LoRA (of `lora`'s shape, the run's `lora` section; default LoraConfig()) on `rows`
    ({"input_ids", "assistant_masks"}) and write the merged model.

    Returns the merged folder; if it is already complete (`sft_done.json`), returns it as is, or
    the adapter folder where only that came back (an SFT run on another host): `model.path` takes
    either.
    """
    import torch
    from datasets import Dataset
    from peft import LoraConfig as PeftLoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTTrainer

    out = Path(out_dir)
    merged = out / MODEL_DIR
    if (out / DONE_FILE).exists() and (merged / "config.json").exists():
        return merged
    if (out / DONE_FILE).exists() and (out / ADAPTER_DIR / "adapter_config.json").exists():
        return out / ADAPTER_DIR
    if not rows:
        raise ValueError("no SFT rows: the warm-start needs at least one verified demonstration or harvested episode")
    out.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(rows):
        if len(r["input_ids"]) != len(r["assistant_masks"]) or not any(r["assistant_masks"]):
            raise ValueError(f"SFT row {i}: input_ids and assistant_masks must have one length and a trained token")
    too_long = sum(len(r["input_ids"]) > cfg.max_length for r in rows)
    if too_long:
        print(f"[sft] {too_long} of {len(rows)} rows exceed warm_start.max_length={cfg.max_length} and are cut",
              flush=True)

    cuda = torch.cuda.is_available()
    if not cuda:    # measured on 1.7k-token rows, bf16 autocast, 2-core box: 1 thread ~12 s, 2 threads ~5 s
        torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
    torch_dtype = getattr(torch, (model_cfg or ModelConfig()).resolved_dtype(on_gpu=cuda))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype)
    select_kernels(model, cfg, cuda)
    lora = lora or LoraConfig()
    targets = lora.target_modules
    peft_cfg = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, task_type="CAUSAL_LM",
                              target_modules="all-linear" if targets == ["all-linear"] else list(targets))
    log_path = out / "sft_log.jsonl"

    class LossLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                append_durable(log_path, [{"step": state.global_step, "epoch": round(state.epoch or 0, 3),
                                           "loss": logs["loss"], "lr": logs.get("learning_rate"),
                                           "time": time.time()}])

    bf16 = (torch_dtype == torch.bfloat16) if cuda else (cfg.cpu_bf16 and cpu_has_bf16())
    args = _sft_args(cfg, out / "trainer", cuda, bf16)
    dataset = Dataset.from_list([{"input_ids": r["input_ids"], "assistant_masks": r["assistant_masks"]}
                                 for r in rows])
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_cfg, callbacks=[LossLog()])
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=_last_checkpoint(out / "trainer"))
    seconds = time.perf_counter() - start

    save_adapter(trainer.model, out / ADAPTER_DIR, model_cfg.path if model_cfg else model_path)
    model = trainer.model.merge_and_unload()
    merged.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(merged, safe_serialization=True)
    tokenizer.save_pretrained(merged)     # carries the serving chat template
    trained = sum(sum(r["assistant_masks"]) for r in rows)
    losses = [r["loss"] for r in read_complete(log_path)] if log_path.is_file() else []
    tokens = sum(len(r["input_ids"]) for r in rows)
    (out / DONE_FILE).write_text(json.dumps({
        "rows": len(rows), "trained_tokens": trained, "tokens": tokens, "epochs": cfg.epochs,
        "seconds": seconds, "seconds_per_1k_tokens": round(1000 * seconds / max(1, tokens * cfg.epochs), 4),
        "final_loss": losses[-1] if losses else None,
        "mean_loss_last_10": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)",
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum, "lr": cfg.lr, "bf16": bf16,
        "base_model": model_path}, indent=1))
    print(f"[sft] {len(rows)} rows, {trained} trained tokens, {seconds:.0f} s -> {merged}", flush=True)
    return merged
