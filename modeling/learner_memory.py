"""Activation-memory savers for long sequences: sequence-tiled MLP, segmented linear
attention, and peak-memory readings.

With gradient checkpointing, the backward of one decoder layer recomputes that layer and
holds all its intermediates at once; at 32k tokens the MLP's [tokens, intermediate] tensors
dominate. Tiling the MLP over the sequence keeps one tile's intermediates alive instead.
"""
from __future__ import annotations

import contextlib
import re
import sys
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from modeling.packing import active_cu_seqlens


class _TiledMLP(torch.autograd.Function):
    """y = mlp(x) computed tile by tile; backward recomputes each tile and backpropagates it.

    Parameter gradients are accumulated into `.grad` directly by the per-tile backward, so the
    parameters are passed in only to make autograd record the node.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: Callable, tile: int, *params: torch.Tensor) -> torch.Tensor:
        ctx.fn, ctx.tile, ctx.n_params = fn, tile, len(params)
        ctx.save_for_backward(x)
        with torch.no_grad():
            return torch.cat([fn(x[..., s:s + tile, :]) for s in range(0, x.shape[-2], tile)], dim=-2)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        for s in range(0, x.shape[-2], ctx.tile):
            xt = x[..., s:s + ctx.tile, :].detach().requires_grad_(grad_x is not None)
            with torch.enable_grad():
                out = ctx.fn(xt)
            torch.autograd.backward(out, grad_out[..., s:s + ctx.tile, :])
            if grad_x is not None:
                grad_x[..., s:s + ctx.tile, :] = xt.grad
        return (grad_x, None, None) + (None,) * ctx.n_params


def tile_mlps(model: torch.nn.Module, tile_tokens: int) -> int:
    """Wrap every decoder layer's `mlp` so sequences longer than tile_tokens run tiled."""
    count = 0
    for name, module in model.named_modules():
        if not re.search(r"layers\.\d+\.mlp$", name):
            continue
        inner = module.forward
        params = [p for p in module.parameters() if p.requires_grad]

        def tiled(x: torch.Tensor, _inner=inner, _params=params) -> torch.Tensor:
            if x.shape[-2] <= tile_tokens or not torch.is_grad_enabled():
                return _inner(x)
            return _TiledMLP.apply(x, _inner, tile_tokens, *_params)

        module.forward = tiled
        count += 1
    if count == 0:
        raise ValueError("mlp tiling found no 'layers.<i>.mlp' modules in this model; set learner.mlp_tile_tokens=0")
    return count


# Segment length in force while a learner computes (forward and backward). A plain process
# global, not a context variable: the recompute inside backward may run on autograd's own
# device thread, which would not see a context variable's value.
_ACTIVE_SEGMENT = [0]


@contextlib.contextmanager
def linear_attention_segments(tokens: int):
    """Enable segmented Gated-DeltaNet (patched by segment_linear_attention) inside the block."""
    previous = _ACTIVE_SEGMENT[0]
    _ACTIVE_SEGMENT[0] = tokens
    try:
        yield
    finally:
        _ACTIVE_SEGMENT[0] = previous


def _segmented_delta_rule(inner: Callable) -> Callable:
    """Run the chunked gated delta rule in checkpointed segments, carrying the recurrent state.

    The PyTorch delta rule keeps fp32 copies of q/k/v and per-chunk intermediates for the whole
    sequence; per-segment checkpoints keep one segment's worth alive in backward. Segments are
    multiples of the rule's 64-token chunk, so the result equals the unsegmented call.
    """
    def call(kw, q, k, v, g, beta, state):
        return inner(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True, **kw)

    def run(query, key, value, g, beta, initial_state=None, output_final_state=False, **kw):
        segment = _ACTIVE_SEGMENT[0]
        length = query.shape[1]
        if (segment <= 0 or length <= segment or not torch.is_grad_enabled()
                or kw.get("cu_seqlens") is not None or active_cu_seqlens() is not None):
            return inner(query, key, value, g=g, beta=beta, initial_state=initial_state,
                         output_final_state=output_final_state, **kw)
        outs, state = [], initial_state
        for s in range(0, length, segment):
            part = slice(s, s + segment)
            out, state = checkpoint(call, kw, query[:, part], key[:, part], value[:, part], g[:, part],
                                    beta[:, part], state, use_reentrant=False)
            outs.append(out)
        return torch.cat(outs, dim=1), (state if output_final_state else None)

    run.segmented = True
    run.__wrapped__ = inner
    return run


def segment_linear_attention(model: torch.nn.Module, segment_tokens: int) -> int:
    """Patch the Gated-DeltaNet layers (Qwen3.5 / Qwen3-Next) so that, inside
    linear_attention_segments(segment_tokens), they run in checkpointed sequence segments."""
    if segment_tokens % 64:
        raise ValueError(f"learner.linear_attn_segment_tokens={segment_tokens} must be a multiple of 64 "
                         f"(the delta rule's chunk size)")
    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    if not layers:
        raise ValueError("learner.linear_attn_segment_tokens > 0, but the model has no Gated-DeltaNet layers; set it to 0")
    for layer in layers:
        module = sys.modules[type(layer).__module__]
        fn = getattr(module, "torch_chunk_gated_delta_rule", None)
        if fn is not None and not getattr(fn, "segmented", False):
            module.torch_chunk_gated_delta_rule = _segmented_delta_rule(fn)
        own = layer.__dict__.get("chunk_gated_delta_rule")
        if callable(own) and not getattr(own, "segmented", False):
            layer.chunk_gated_delta_rule = _segmented_delta_rule(own)
    return len(layers)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak window: CUDA allocator stats, or the process RSS high-water mark."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS


def peak_memory_gib(device: torch.device) -> float:
    """Peak since reset_peak_memory: CUDA allocated bytes, or peak process RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError("VmHWM missing from /proc/self/status")


def release_free_heap(device: torch.device) -> None:
    """On CPU, hand the heap's free pages back to the OS (glibc's malloc_trim).

    glibc keeps the memory of freed tensors in its arenas -- one per allocating thread, and
    activations of a few MB each land there, not in their own mappings -- so after a long
    sequence's update the process stays at that update's peak: the learner's RSS is then the
    largest peak so far, not this step's (python -m bench.learner_rss reads the heap). Called once a step.
    """
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None)
    if hasattr(libc, "malloc_trim"):  # glibc; musl has none and keeps no such arenas
        libc.malloc_trim(0)
