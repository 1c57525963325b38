"""Fast Gated-DeltaNet and causal-conv kernels (flash-linear-attention) for Qwen3.5 / Qwen3-Next.

transformers falls back to a PyTorch delta rule (a Python loop over 64-token chunks, fp32) and a
cuDNN depthwise conv when fla / causal_conv1d are missing; on the H200 that fallback was most of
a learner step. enable_fast_kernels() swaps in fla's Triton kernels, but only after a start-up
check: forward and every input gradient of the fast path, on a short packed sequence with the
model's own head sizes, must agree with the PyTorch reference. Otherwise the reference stays and
a log line says why.

The Hopper guard. fla 0.6.0 refuses the gated `chunk_bwd_dqkwg` on Hopper with Triton in
[3.4, 3.7.1) (fla issue 640: a Triton miscompile of a transposed wgmma result). The miscompile was
bisected to one block width, BK=64; on Hopper fla 0.6.0 tiles that kernel at BK=min(K, 128), so
heads with K >= 128 (Qwen3.5: 128) never take the bad path. The guard is lifted only then, and the
start-up check still has the last word on the gradients. vLLM's vendored copy of the same Triton
kernels ran on this GPU because it carries only the forward kernels (inference); the guard sits in
the backward.

Packed rows: both kernels honour the cu_seqlens of modeling.packing.packed_rows(); so does the
reference path, by running the PyTorch functions once per sequence.
"""
from __future__ import annotations

import logging
import sys
from typing import Callable

import torch
import torch.nn.functional as F

from modeling.packing import active_cu_seqlens

log = logging.getLogger(__name__)

# Relative error (||fast - ref|| / ||ref||) the check accepts: bf16 kernels against an fp32 reference.
CHECK_TOLERANCE = 2e-2


def _gdn_modules(model: torch.nn.Module) -> list:
    """The Python modules that define the model's Gated-DeltaNet layers (their globals get patched)."""
    mods = {sys.modules[type(m).__module__] for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")}
    return sorted(mods, key=lambda m: m.__name__)


def _reference(fn: Callable) -> Callable:
    """The PyTorch function under transformers' kernel wrappers and this module's own."""
    while True:
        inner = getattr(fn, "reference", None) or getattr(fn, "__wrapped__", None)
        if inner is None:
            return fn
        fn = inner


def _per_sequence(call: Callable, tensors: list[torch.Tensor], dim: int, cu: torch.Tensor) -> list[torch.Tensor]:
    bounds = cu.tolist()
    return [call(*[t.narrow(dim, s, e - s) for t in tensors]) for s, e in zip(bounds[:-1], bounds[1:])]


def make_delta_rule(reference: Callable, fast: Callable | None) -> Callable:
    """transformers-signature chunk_gated_delta_rule: fla on CUDA when `fast`, else the reference;
    both split packed rows at cu_seqlens."""
    def run(query, key, value, g, beta, chunk_size: int = 64, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kw):
        packed = active_cu_seqlens()
        cu, cu_cpu = (cu_seqlens, None) if cu_seqlens is not None else (packed if packed else (None, None))
        if fast is not None and query.is_cuda:
            return fast(query, key, value, g=g, beta=beta, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
        if cu is None:
            return reference(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                             output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        if initial_state is not None:
            raise NotImplementedError("packed rows with an initial recurrent state")

        def one(q, k, v, g_, b_):
            return reference(q, k, v, g=g_, beta=b_, chunk_size=chunk_size, output_final_state=output_final_state,
                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        parts = _per_sequence(one, [query, key, value, g, beta], 1, cu_cpu if cu_cpu is not None else cu.cpu())
        out = torch.cat([p[0] for p in parts], dim=1)
        return out, (torch.cat([p[1] for p in parts], dim=0) if output_final_state else None)

    run.reference = reference
    run.fast = fast is not None
    return run


def make_causal_conv(reference: Callable, fast: Callable | None) -> Callable:
    """transformers-signature causal_conv1d_fn (x [B, D, T], weight [D, W]); fla on CUDA when `fast`."""
    def run(hidden_states, weight, bias=None, activation=None, **kw):
        packed = active_cu_seqlens()
        if fast is not None and hidden_states.is_cuda:
            y, _ = fast(hidden_states.transpose(1, 2), weight=weight, bias=bias, activation=activation,
                        cu_seqlens=packed[0] if packed else None, cu_seqlens_cpu=packed[1] if packed else None)
            return y.transpose(1, 2)
        if packed is None:
            return reference(hidden_states, weight, bias, activation=activation)
        parts = _per_sequence(lambda x: reference(x, weight, bias, activation=activation), [hidden_states], 2, packed[1])
        return torch.cat(parts, dim=2)

    run.reference = reference
    run.fast = fast is not None
    return run


def _load_fla(head_k_dim: int) -> tuple[Callable, Callable]:
    from fla.modules.causal_conv1d import causal_conv1d
    from fla.ops.common import chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    if getattr(chunk_o, "IS_NVIDIA_HOPPER", False) and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        if head_k_dim < 128:
            raise RuntimeError(f"Hopper with Triton < 3.7.1 and Gated-DeltaNet key heads of {head_k_dim} "
                               f"(< 128): fla's gated chunk_bwd_dqkwg would take its miscompiled BK=64 path")
        chunk_o.TRITON_ABOVE_3_7_1 = True  # see the module docstring: K >= 128 tiles at BK=128
    return chunk_gated_delta_rule, causal_conv1d


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def check_kernels(delta_rule: Callable, conv: Callable, ref_delta: Callable, ref_conv: Callable,
                  heads: int, k_dim: int, v_dim: int, device: torch.device, lengths=(100, 220, 64),
                  seed: int = 0) -> dict[str, float]:
    """Relative errors of fast vs reference, forward and input gradients, on one packed row of
    `lengths` (boundaries off the 64-token chunk grid); the fast path runs in bf16, the reference in fp32."""
    from modeling.packing import packed_rows

    gen = torch.Generator(device="cpu").manual_seed(seed)
    t = sum(lengths)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    q, k, v = rnd(1, t, heads, k_dim), rnd(1, t, heads, k_dim), rnd(1, t, heads, v_dim)
    g = F.logsigmoid(rnd(1, t, heads) + 3.0)  # log decays in (-inf, 0), mostly near 0 as in trained models
    beta = torch.sigmoid(rnd(1, t, heads))
    d_conv = 3 * heads * 8
    x, w = rnd(1, d_conv, t), rnd(d_conv, 4, scale=0.5)
    grad_o, grad_y = rnd(1, t, heads, v_dim), rnd(1, d_conv, t)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device)

    def run(rule, cv, dtype):
        qq, kk, vv, bb, xx = [a.detach().to(dtype).requires_grad_() for a in (q, k, v, beta, x)]
        gg = g.detach().clone().requires_grad_()  # the decay stays fp32, as in the model
        with packed_rows(cu):
            o, _ = rule(qq, kk, vv, g=gg, beta=bb, use_qk_l2norm_in_kernel=True)
            y = cv(xx, w.to(dtype), None, activation="silu")
            (o.float() * grad_o).sum().add((y.float() * grad_y).sum()).backward()
        return {"o": o, "dq": qq.grad, "dk": kk.grad, "dv": vv.grad, "dbeta": bb.grad, "dg": gg.grad,
                "conv": y, "dconv": xx.grad}

    want = run(make_delta_rule(ref_delta, None), make_causal_conv(ref_conv, None), torch.float32)
    got = run(delta_rule, conv, torch.bfloat16)
    out = {name: _rel(got[name], want[name]) for name in want}
    out["o_max_abs"] = float((got["o"].detach().float() - want["o"].detach()).abs().max())
    return out


def enable_fast_kernels(model: torch.nn.Module, device: torch.device, required: bool = False,
                        fast: bool = True) -> dict:
    """Patch the model's Gated-DeltaNet modules to fla's kernels if the start-up check passes.

    Returns {"fast": bool, "reason": str, "check": {...}}. Always installs the packing-aware
    wrappers (reference path on CPU or on failure), so packed rows stay correct either way.
    required=True raises instead of falling back.
    """
    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    if not layers:
        return {"fast": False, "reason": "no Gated-DeltaNet layers", "check": {}}
    modules = _gdn_modules(model)
    for mod in modules:
        for name in ("torch_chunk_gated_delta_rule", "causal_conv1d_fn"):
            if not callable(getattr(mod, name, None)):
                raise RuntimeError(f"{mod.__name__} has no {name}; this transformers version is not supported")
    ref_delta = _reference(modules[0].torch_chunk_gated_delta_rule)
    ref_conv = _reference(modules[0].causal_conv1d_fn)
    layer = layers[0]
    heads, k_dim, v_dim = layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
    result = {"fast": False, "reason": "", "check": {}}
    fast_delta = fast_conv = None
    if not fast:
        result["reason"] = "learner.fast_kernels=off"
    elif device.type != "cuda":
        result["reason"] = "no CUDA device"
    else:
        try:
            fast_delta, fast_conv = _load_fla(k_dim)
            delta, conv = make_delta_rule(ref_delta, fast_delta), make_causal_conv(ref_conv, fast_conv)
            # the model's own head count: the kernels are compiled and autotuned per head count
            result["check"] = check_kernels(delta, conv, ref_delta, ref_conv, heads, k_dim, v_dim, device)
            worst = max(v for n, v in result["check"].items() if n != "o_max_abs")
            if worst > CHECK_TOLERANCE:
                result["reason"] = f"fast kernels disagree with the reference (worst rel. error {worst:.3g})"
            else:
                result["fast"], result["reason"] = True, f"check passed (worst rel. error {worst:.3g})"
        except (ImportError, RuntimeError) as e:
            result["reason"] = f"{type(e).__name__}: {e}"
    if not result["fast"]:
        fast_delta = fast_conv = None
        if required and fast:
            raise RuntimeError(f"learner.fast_kernels='on' but the fast Gated-DeltaNet path is unusable: {result['reason']}")
        log.warning("Gated-DeltaNet: PyTorch reference kernels (%s)", result["reason"])
    else:
        log.info("Gated-DeltaNet: flash-linear-attention kernels (%s)", result["reason"])
    for mod in modules:
        rule = make_delta_rule(ref_delta, fast_delta)
        if getattr(mod.torch_chunk_gated_delta_rule, "segmented", False):  # another learner's segments stay
            from modeling.learner_memory import _segmented_delta_rule
            rule = _segmented_delta_rule(rule)
        mod.torch_chunk_gated_delta_rule = rule
        mod.causal_conv1d_fn = make_causal_conv(ref_conv, fast_conv)
    return result


if __name__ == "__main__":  # agreement numbers on this machine, Qwen3.5-4B head sizes
    import json
    import time

    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    from modeling.packing import packed_rows  # noqa: F401  (import check)

    dev = torch.device("cuda")
    rd, rc = _reference(m.torch_chunk_gated_delta_rule), _reference(m.causal_conv1d_fn)
    fd, fc = _load_fla(128)
    for attempt in range(2):  # the first compiles and autotunes the Triton kernels
        t0 = time.perf_counter()
        got = check_kernels(make_delta_rule(rd, fd), make_causal_conv(rc, fc), rd, rc, 32, 128, 128, dev)
        print(json.dumps({"seconds": time.perf_counter() - t0, **got}), flush=True)
