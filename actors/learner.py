"""The Learner: base model + PEFT LoRA, AdamW, one GRPO optimizer step per call.

A plain class; the driver wraps it with `ray.remote(Learner)`. The loss goes through the
chunked fused-linear log-prob (modeling.fused_logprob), so the [tokens, vocab] logits are never
materialized. In a data-parallel group (world_size > 1) every rank holds the same LoRA,
trains on its share of the batch, and gradients are all-reduced before the step; token
counts are all-reduced first so the loss is normalized by the whole batch's tokens.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from actors.sync_cuda_ipc import MergedBuckets, device_uuid
from modeling.checkpoint_layout import CheckpointLayout
from modeling.fast_kernels import enable_fast_kernels
from modeling.fused_logprob import chunked_target_logprobs, naive_target_logprobs
from modeling.learner_memory import (
    linear_attention_segments,
    peak_memory_gib,
    release_free_heap,
    reset_peak_memory,
    segment_linear_attention,
    tile_mlps,
)
from modeling.packing import micro_batches, pack, packed_micro_batches, packed_rows
from modeling.precision import cpu_has_bf16
from modeling.shared_prefix import prefix_micro_batches, prefix_row, shared_prefix_rows, use_shared_prefix_attention
from rl.config import LearnerConfig, LoraConfig, ModelConfig
from rl.folders import read_folder, write_folder
from rl.grpo import grpo_token_loss, sequence_weights
from rl.types import TrainSample

ADAPTER_NAME = "default"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def name_gloo_interface(rank0_addr: str) -> None:
    """gloo takes this process's address from the hostname, which on a multi-homed node (or
    one whose hostname resolves to another network) is not the one the other ranks reach;
    name the interface that routes to rank 0 instead, unless GLOO_SOCKET_IFNAME is set."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    import psutil

    host, port = rank0_addr.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port)))  # UDP: no packet is sent, the kernel only picks the route
        local = s.getsockname()[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == local for a in addrs):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def pick_device() -> torch.device:
    """A real CUDA device if torch sees one (a logical Ray GPU on a CPU box is not one)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def pick_dtype(model_cfg: ModelConfig, device: torch.device) -> torch.dtype:
    return getattr(torch, model_cfg.resolved_dtype(on_gpu=device.type == "cuda"))


class Learner:
    def __init__(self, model_path: str, cfg: LearnerConfig, model_cfg: ModelConfig, seed: int,
                 rank: int = 0, world_size: int = 1, dist_addr: str | None = None,
                 *, lora: LoraConfig | None = None, base_model: torch.nn.Module | None = None):
        """lora: the adapter's shape (the run's `lora` section; default LoraConfig()).
        base_model: an already-built HF causal LM (benchmarks with random weights); else loaded from model_path."""
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.set_num_threads(cfg.torch_threads)
        self.cfg, self.model_cfg = cfg, model_cfg
        self.model_path = model_path
        self.rank, self.world_size = rank, world_size
        self.device = pick_device()
        self.dtype = pick_dtype(model_cfg, self.device)
        self._cpu_bf16 = self.device.type == "cpu" and cfg.cpu_bf16 and cpu_has_bf16()  # read /proc/cpuinfo once
        # the checkpoint's own names, for what the learner hands the engine (None: no folder)
        self.layout = CheckpointLayout.of(model_path) if model_path and Path(model_path, "config.json").is_file() \
            else None
        if self.device.type == "cuda" and cfg.gpu_memory_fraction < 1:
            # the learner's share of a card it shares with a vLLM engine (the 24 GB recipe)
            torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_fraction, self.device)
        self.steps_done = 0
        if world_size > 1:
            if not dist_addr:
                raise ValueError("world_size > 1 needs dist_addr='host:port' for torch.distributed rendezvous")
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            if backend == "gloo":
                name_gloo_interface(dist_addr)
            dist.init_process_group(backend, init_method=f"tcp://{dist_addr}", rank=rank, world_size=world_size)

        random.seed(seed)
        torch.manual_seed(seed)  # same seed on every rank: identical LoRA init
        if base_model is None:
            # the text config named explicitly: transformers picks it from a multimodal folder by
            # itself, except in a process where vLLM 0.26 has loaded the same folder (it then hands
            # the text model the outer config, which has no vocab_size)
            base_model = AutoModelForCausalLM.from_pretrained(
                model_path, config=AutoConfig.from_pretrained(model_path).get_text_config(),
                dtype=self.dtype, low_cpu_mem_usage=True,
                device_map={"": self.device} if self.device.type == "cuda" else None)
        base_model.to(self.device)
        base_model.config.use_cache = False
        lora = lora or LoraConfig()
        targets = lora.target_modules
        peft_cfg = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                  target_modules="all-linear" if targets == ["all-linear"] else list(targets),
                                  task_type="CAUSAL_LM")
        self.model = get_peft_model(base_model, peft_cfg)
        base = self.model.get_base_model()
        self.decoder = base.model  # the transformer body: hidden states, no LM head
        self.lm_head = base.get_output_embeddings()
        if any(p.requires_grad for p in self.lm_head.parameters()):
            raise ValueError("the LM head is trainable, but the fused loss treats it as frozen; "
                             "remove 'lm_head' from lora.target_modules")
        if cfg.gradient_checkpointing:
            # activation offload needs the reentrant form: it saves the layer inputs through
            # save_for_backward, which save_on_cpu can intercept
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": cfg.activation_offload})
            if cfg.activation_offload:
                self.model.enable_input_require_grads()
        elif cfg.activation_offload:
            raise ValueError("learner.activation_offload=true needs learner.gradient_checkpointing=true")
        # always: "off" must install the PyTorch path, since transformers itself picks fla's kernels
        # whenever fla is importable (and fla refuses its gated backward on Hopper with Triton < 3.7.1)
        self.fast_kernels = enable_fast_kernels(self.decoder, self.device, required=cfg.fast_kernels == "on",
                                                fast=cfg.fast_kernels != "off")
        if cfg.mlp_tile_tokens > 0:
            tile_mlps(self.decoder, cfg.mlp_tile_tokens)
        if cfg.linear_attn_segment_tokens > 0:
            segment_linear_attention(self.decoder, cfg.linear_attn_segment_tokens)
        if cfg.layout == "shared_prefix":
            use_shared_prefix_attention(base)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if world_size > 1:
            for p in self.params:
                dist.broadcast(p.data, src=0)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.model.train()

    # ---- model pieces -------------------------------------------------------------------

    def num_trainable_params(self) -> int:
        return sum(p.numel() for p in self.params)

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        offload = self.cfg.activation_offload and torch.is_grad_enabled()
        ctx = (torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")
               if offload else contextlib.nullcontext())
        with ctx:
            out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False)
        return out.last_hidden_state

    def _target_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.cfg.loss_impl == "naive":
            return naive_target_logprobs(hidden, self.lm_head.weight, targets)
        return chunked_target_logprobs(hidden, self.lm_head.weight, targets, self.cfg.logit_chunk_tokens)

    def _check(self, samples: list[TrainSample]) -> None:
        vocab = self.lm_head.weight.shape[0]
        for i, s in enumerate(samples):
            if len(s.token_ids) < 2:
                raise ValueError(f"sample {i} has {len(s.token_ids)} tokens; a trained sequence needs >= 2")
            lo, hi = min(s.token_ids), max(s.token_ids)
            if lo < 0 or hi >= vocab:
                raise ValueError(f"sample {i} has token ids outside the vocabulary [0, {vocab}): min {lo}, max {hi}")
            if any(m not in (0, 1) for m in s.loss_mask):
                raise ValueError(f"sample {i}: loss_mask must hold only 0/1")

    def _autocast(self):
        """learner.cpu_bf16: bf16 matmuls on a CPU that has them (fp32 weights, grads and optimizer)."""
        if self._cpu_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    # ---- training -----------------------------------------------------------------------

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step over all samples; loss = sum over trained tokens / their count."""
        error = None
        try:
            self._check(samples)
        except ValueError as e:
            error = e
        if self.world_size > 1:  # every rank must learn of a bad shard, or the others hang in all-reduce
            bad = self._all_reduce(torch.tensor([float(error is not None)], device=self.device))
            if error is None and bad.item() > 0:
                raise ValueError("another learner rank rejected its share of the batch; step skipped")
        if error is not None:
            raise error
        start = time.perf_counter()
        reset_peak_memory(self.device)
        cfg = self.cfg
        trained = [s for s in samples if sum(s.loss_mask)]
        counts = [sum(s.loss_mask[1:]) for s in trained]  # targets: a sample's first token is never one
        totals = self._all_reduce(torch.tensor([float(sum(counts)), float(len(trained))], device=self.device))
        total_tokens, total_seqs = int(totals[0].item()), int(totals[1].item())
        if total_tokens == 0:
            raise ValueError("train_step got no trained tokens (every loss_mask is all zeros)")
        weights = {id(s): w for s, w in zip(trained, sequence_weights(counts, cfg.loss_agg, total_tokens,
                                                                      total_seqs))}
        for p in self.params:  # a rank with no local tokens still all-reduces (zero) gradients
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.optimizer.zero_grad(set_to_none=False)
        # fp64 sums: weighted loss, clipped tokens, ratio, kl, IS weight, IS-capped tokens
        stats = torch.zeros(6, dtype=torch.float64, device=self.device)
        with linear_attention_segments(cfg.linear_attn_segment_tokens), self._autocast():
            if cfg.layout == "shared_prefix":
                for batch in prefix_micro_batches(trained, cfg.micro_batch_tokens):
                    stats += self._prefix_micro_step(batch, [weights[id(s)] for s in batch])
            elif cfg.layout == "packed":
                for batch in packed_micro_batches(trained, cfg.micro_batch_tokens):
                    stats += self._packed_micro_step(batch, [weights[id(s)] for s in batch])
            else:
                for batch in micro_batches(trained, cfg.micro_batch_tokens):
                    stats += self._micro_step(batch, [weights[id(s)] for s in batch])
        self._all_reduce(stats)
        grads = [p.grad for p in self.params]
        if self.world_size > 1:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=False)
            raise FloatingPointError(f"non-finite gradient norm {grad_norm.item()}; step skipped, weights unchanged")
        self.optimizer.step()
        self.steps_done += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out = {
            "loss": stats[0].item(),
            "grad_norm": float(grad_norm),
            "clip_frac": stats[1].item() / total_tokens,
            "ratio_mean": stats[2].item() / total_tokens,
            "tokens": float(total_tokens),
            "seconds": time.perf_counter() - start,
            "peak_mem_gib": peak_memory_gib(self.device),
        }
        if cfg.beta > 0:
            out["kl"] = stats[3].item() / total_tokens
        if cfg.tis_cap is not None:
            out["tis_weight_mean"] = stats[4].item() / total_tokens
            out["tis_capped_frac"] = stats[5].item() / total_tokens
        if self.device.type == "cuda" and cfg.gpu_memory_fraction < 1:
            # a card shared with a sleeping engine: hand the step's activation memory back before it wakes,
            # so the cap bounds the learner while it trains, not the card while both are awake
            torch.cuda.empty_cache()
        release_free_heap(self.device)
        return out

    def _micro_step(self, batch: list[TrainSample], weights: list[float]) -> torch.Tensor:
        cfg = self.cfg
        length = max(len(s.token_ids) for s in batch)
        ids = torch.zeros(len(batch), length, dtype=torch.long)
        attn = torch.zeros(len(batch), length, dtype=torch.long)
        mask = torch.zeros(len(batch), length, dtype=torch.bool)
        old = torch.zeros(len(batch), length, dtype=torch.float32)
        adv = torch.zeros(len(batch), length, dtype=torch.float32)
        wt = torch.zeros(len(batch), length, dtype=torch.float32)
        for b, s in enumerate(batch):
            n = len(s.token_ids)
            ids[b, :n] = torch.tensor(s.token_ids)
            attn[b, :n] = 1
            mask[b, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
            old[b, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
            adv[b, :n] = s.advantage
            wt[b, :n] = weights[b]
        ids, attn = ids.to(self.device), attn.to(self.device)
        sel = mask[:, 1:].to(self.device)  # target i is predicted from position i-1
        targets = ids[:, 1:][sel]
        ref_logp = None
        if cfg.beta > 0:
            with torch.no_grad(), self.model.disable_adapter():
                ref_hidden = self._hidden(ids, attn if len(batch) > 1 else None)[:, :-1][sel]
                ref_logp = self._target_logprobs(ref_hidden, targets)
                del ref_hidden
        hidden = self._hidden(ids, attn if len(batch) > 1 else None)[:, :-1][sel]
        logp = self._target_logprobs(hidden, targets)
        tl = grpo_token_loss(logp, old[:, 1:][mask[:, 1:]], adv[:, 1:][mask[:, 1:]],
                             cfg.clip_eps_low, cfg.clip_eps_high, cfg.beta, ref_logp, cfg.tis_cap)
        return self._backward(tl, wt[:, 1:][mask[:, 1:]].to(self.device))

    def _backward(self, tl, token_weights: torch.Tensor) -> torch.Tensor:
        """Backward of this micro-batch's share of the batch loss; returns its stat sums."""
        (tl.loss * token_weights).sum().backward()
        zero = torch.zeros((), device=self.device)
        return torch.stack([(tl.loss.detach() * token_weights).sum(), tl.clipped.sum(), tl.ratio.sum(),
                            tl.kl.sum() if tl.kl is not None else zero,
                            tl.is_weight.sum() if tl.is_weight is not None else zero,
                            tl.is_capped.sum() if tl.is_capped is not None else zero]).double()

    def _packed_micro_step(self, batch: list[TrainSample], weights: list[float]) -> torch.Tensor:
        """_micro_step on one packed row (modeling.packing): no pad tokens, per-sample boundaries kept."""
        cfg = self.cfg
        row = {k: v.to(self.device) for k, v in pack(batch, weights).items()}
        sel = row["mask"][:, 1:]
        targets = row["ids"][:, 1:][sel]
        with packed_rows(row["cu_seqlens"]):
            ref_logp = None
            if cfg.beta > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    ref_logp = self._target_logprobs(self._hidden(row["ids"], None, row["positions"])[:, :-1][sel],
                                                     targets)
            hidden = self._hidden(row["ids"], None, row["positions"])[:, :-1][sel]
            logp = self._target_logprobs(hidden, targets)
            tl = grpo_token_loss(logp, row["old"][:, 1:][sel], row["adv"][:, 1:][sel],
                                 cfg.clip_eps_low, cfg.clip_eps_high, cfg.beta, ref_logp, cfg.tis_cap)
            return self._backward(tl, row["w"][:, 1:][sel])  # the recompute in backward needs the boundaries too

    def _prefix_micro_step(self, batch: list[TrainSample], weights: list[float]) -> torch.Tensor:
        """_micro_step on one shared-prefix row (modeling.shared_prefix): the samples' common prefix
        is computed once, each remainder attends to it and to itself."""
        cfg = self.cfg
        row = prefix_row(batch, weights)
        t = {k: row[k].to(self.device) for k in ("ids", "positions", "src", "targets", "old", "adv", "w")}
        with shared_prefix_rows(row["prefix"], row["spans"]):
            ref_logp = None
            if cfg.beta > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    ref_logp = self._target_logprobs(self._hidden(t["ids"], None, t["positions"])[0, t["src"]],
                                                     t["targets"])
            hidden = self._hidden(t["ids"], None, t["positions"])[0, t["src"]]
            logp = self._target_logprobs(hidden, t["targets"])
            tl = grpo_token_loss(logp, t["old"], t["adv"], cfg.clip_eps_low, cfg.clip_eps_high, cfg.beta, ref_logp,
                                 cfg.tis_cap)
            return self._backward(tl, t["w"])  # the recompute in backward needs the layout too

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token_i | prefix) under the current policy; 0.0 at index 0 (no prefix)."""
        if len(token_ids) < 2:
            raise ValueError(f"sequence_logprobs needs >= 2 tokens, got {len(token_ids)}")
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        self.model.eval()
        try:
            hidden = self._hidden(ids, None)[0, :-1]
            logp = chunked_target_logprobs(hidden, self.lm_head.weight, ids[0, 1:], self.cfg.logit_chunk_tokens)
        finally:
            self.model.train()
        return [0.0] + logp.tolist()

    def lora_state(self) -> dict[str, torch.Tensor]:
        """CPU copies of the trainable weights (replica agreement checks)."""
        return {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters() if p.requires_grad}

    def last_gradients(self) -> dict[str, torch.Tensor]:
        """CPU copies of the gradients the last step applied (after clipping, before the optimizer):
        what equivalence checks compare, since one Adam step moves every weight by about ±lr
        whatever its gradient's size and so hides (or magnifies) the difference."""
        return {n: p.grad.detach().to("cpu", copy=True) for n, p in self.model.named_parameters()
                if p.requires_grad and p.grad is not None}

    # ---- saving -------------------------------------------------------------------------

    def save_adapter(self, path: str) -> str:
        """PEFT adapter folder (adapter_config.json + adapter_model.safetensors) for vLLM's LoRA loader."""
        Path(path).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, selected_adapters=[ADAPTER_NAME])
        if self.layout is not None and self.layout.multimodal:  # names as the served checkpoint has them
            from safetensors.torch import load_file, save_file

            file = Path(path) / "adapter_model.safetensors"
            tensors = {self.layout.to_checkpoint_adapter_key(k): v for k, v in load_file(str(file)).items()}
            save_file(tensors, str(file), metadata={"format": "pt"})
        return str(path)

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """Base weights with W + scale*B@A folded in, under the base model's own key names, on CPU.

        One delta at a time, each merged tensor moved to host memory as soon as it is made: a 4B
        learner under a 12 GiB cap has no room for all deltas at once."""
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        lora = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer) and ADAPTER_NAME in m.lora_A}
        merged: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for key, tensor in base.state_dict().items():
                if "lora_" in key:
                    continue
                clean = key.replace(".base_layer.", ".")
                module = clean.rsplit(".", 1)[0]
                if clean.endswith(".weight") and module in lora:
                    tensor = tensor + lora[module].get_delta_weight(ADAPTER_NAME).to(tensor.dtype)
                merged[clean] = tensor.to("cpu")
        return merged

    def lora_factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
        """Each adapted weight's LoRA factors as (A, B, scale) CPU tensors, under the checkpoint's
        key names: the engine folds W + scale*B@A in itself (sync.strategy=merged_on_engine), so a sync
        ships megabytes of factors instead of the whole model."""
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        factors = {}
        for name, m in base.named_modules():
            if not (isinstance(m, LoraLayer) and ADAPTER_NAME in m.lora_A):
                continue
            if m.fan_in_fan_out:
                raise ValueError(f"{name}: fan_in_fan_out LoRA layers are not supported by sync.strategy=merged_on_engine")
            key = f"{name.replace('.base_layer', '')}.weight"
            key = self.layout.to_checkpoint_key(key) if self.layout is not None else key
            factors[key] = (m.lora_A[ADAPTER_NAME].weight.detach().to("cpu", copy=True),
                            m.lora_B[ADAPTER_NAME].weight.detach().to("cpu", copy=True),
                            float(m.scaling[ADAPTER_NAME]))
        return factors

    def merged_weights(self) -> dict[str, torch.Tensor]:
        """The merged model as CPU tensors under the checkpoint's key names (a tied LM head
        left out, shared storage cloned): what vLLM loads, from a file or from memory."""
        base = self.model.get_base_model()
        state = self.merged_state_dict()
        if getattr(base.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        layout = self.layout
        seen: set[int] = set()
        tensors = {}
        for k, v in state.items():
            k = layout.to_checkpoint_key(k) if layout is not None else k
            v = v.detach().contiguous()
            if v.data_ptr() in seen:
                v = v.clone()
            seen.add(v.data_ptr())
            tensors[k] = v
        return tensors

    def save_merged(self, path: str) -> str:
        """Merged full model (safetensors + config + tokenizer files) loadable by vLLM or from_pretrained."""
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        base, layout = self.model.get_base_model(), self.layout
        tmp = out / "model.safetensors.tmp"
        save_file(self.merged_weights(), str(tmp), metadata={"format": "pt"})
        os.replace(tmp, out / "model.safetensors")
        if layout is not None and layout.multimodal:  # the checkpoint's own config: vLLM serves its architecture
            (out / "config.json").write_text(json.dumps(layout.config, indent=2))
        else:
            base.config.save_pretrained(out)
        if self.model_path and Path(self.model_path).is_dir():
            for f in Path(self.model_path).iterdir():
                if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name != "config.json" \
                        and not f.name.endswith(".index.json"):
                    shutil.copy2(f, out / f.name)
        return str(out)

    def adapter_files(self) -> dict[str, bytes]:
        """The PEFT adapter folder as a value: a rollout worker on any node installs it."""
        with tempfile.TemporaryDirectory(prefix="rlvr-adapter-") as d:
            self.save_adapter(d)
            return read_folder(d)

    # ---- sync.strategy=cuda_ipc: the driver side is actors.sync_cuda_ipc.CudaIpcSync ----------

    def gpu_uuid(self) -> str:
        return device_uuid(self.device)

    def ipc_plan(self, bucket_bytes: int) -> int:
        """Group the adapted weights into buffers of at most bucket_bytes; returns how many."""
        self._ipc = MergedBuckets(self.model, self.layout, bucket_bytes)
        return len(self._ipc.buckets)

    def ipc_bucket(self, i: int) -> bytes:
        """Bucket i merged on the GPU, as a CUDA IPC handle the engines open (held until released)."""
        return self._ipc.export(i)

    def ipc_release(self, *installed) -> None:
        """Called with the engines' install results: every engine has copied the bucket."""
        self._ipc.release()

    def state_files(self) -> dict[str, bytes]:
        """save_state's folder as a value: the driver writes the checkpoint on its own node."""
        with tempfile.TemporaryDirectory(prefix="rlvr-state-") as d:
            self.save_state(d)
            return read_folder(d)

    def load_state_files(self, files: dict[str, bytes]) -> None:
        with tempfile.TemporaryDirectory(prefix="rlvr-state-") as d:
            self.load_state(str(write_folder(files, d)))

    def save_state(self, path: str) -> None:
        """LoRA weights + optimizer + RNG + step count: enough to resume bit-for-bit."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.save_adapter(str(out / "adapter"))
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        torch.save({"optimizer": self.optimizer.state_dict(), "rng": rng, "steps_done": self.steps_done},
                   out / "trainer_state.pt")
        (out / "learner.json").write_text(json.dumps({"steps_done": self.steps_done,
                                                      "trainable_params": self.num_trainable_params()}))

    def load_state(self, path: str) -> None:
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        src = Path(path)
        adapter_file = src / "adapter" / "adapter_model.safetensors"
        state_file = src / "trainer_state.pt"
        for f in (adapter_file, state_file):
            if not f.is_file():
                raise FileNotFoundError(f"learner state {path} is incomplete: missing {f}")
        tensors = load_file(str(adapter_file), device=str(self.device))
        if self.layout is not None:  # saved under the checkpoint's names (save_adapter)
            tensors = {self.layout.to_text_adapter_key(k): v for k, v in tensors.items()}
        result = set_peft_model_state_dict(self.model, tensors, adapter_name=ADAPTER_NAME)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"adapter in {path} does not fit this model: unexpected keys {unexpected[:5]}")
        state = torch.load(state_file, map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"].cpu())
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"].cpu(), self.device)
        self.steps_done = int(state["steps_done"])

    def shutdown(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
