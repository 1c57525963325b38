"""The GRPO loss through the LM head, side by side: the project's chunked log-prob loss
(modeling.fused_logprob + rl.grpo) against liger-kernel's LigerFusedLinearGRPOLoss.

Same hidden states, frozen LM head, targets, old log-probs and advantages; one forward+backward to
the hidden states per call. Reports extra peak memory over the inputs, median time, and the loss
and hidden-gradient agreement with the chunked path.

liger's chunked losses chunk along the batch (rows), not along tokens: one long sample is one
row, so it is also run with the row cut into 1024-token rows (the same loss under 'bnpo'
normalisation, since the GRPO objective here is per token). liger-kernel is not a project
dependency (the chunked loss won): install it beside the project to run this.

  python -m bench.lm_head_loss --lengths 8192,16384,32768 --json docs/results/lm_head_loss_h200.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from modeling.fused_logprob import chunked_target_logprobs
from rl.grpo import grpo_token_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28


def inputs(n: int, hidden: int, vocab: int, device, dtype, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = (torch.randn(vocab, hidden, generator=g) * 0.02).to(device, dtype)
    h = torch.randn(n, hidden, generator=g).to(device, dtype)
    targets = torch.randint(0, vocab, (n,), generator=g).to(device)
    old = (-torch.rand(n, generator=g) * 7 - 5).to(device)
    return w, h, targets, old


def chunked(w, h, targets, old, adv: float, chunk: int = 1024):
    logp = chunked_target_logprobs(h, w, targets, chunk)
    tl = grpo_token_loss(logp, old, torch.full_like(old, adv), EPS_LOW, EPS_HIGH)
    return tl.loss.sum() / h.shape[0]


def liger(rows: int, compiled: bool):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    fn = LigerFusedLinearGRPOLoss(beta=0.0, compiled=compiled, use_ref_model=False, chunk_size=1,
                                  epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, loss_type="bnpo")

    def run(w, h, targets, old, adv: float):
        n = h.shape[0]
        r = rows if rows > 0 else n
        x = h.view(n // r, r, h.shape[1])
        loss, _ = fn(x, w, targets.view(n // r, r), torch.ones(n // r, r, device=h.device, dtype=torch.long),
                     torch.full((n // r,), adv, device=h.device), old_per_token_logps=old.view(n // r, r))
        return loss
    return run


def measure(fn, w, h, targets, old, device, repeats: int) -> dict:
    times, loss, grad = [], None, None
    for i in range(repeats + 1):  # the first call warms up (kernels, compilation)
        x = h.detach().clone().requires_grad_()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        loss = fn(w, x, targets, old, 1.0)
        loss.backward()
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize()
            if i:
                times.append(start.elapsed_time(end) / 1e3)
            extra = (torch.cuda.max_memory_allocated() - base) / 2**30
        else:
            extra = float("nan")
        grad = x.grad
    return {"loss": float(loss.detach()), "grad": grad, "extra_peak_gib": extra,
            "median_s": statistics.median(times) if times else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="8192,16384,32768")
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impls", default="chunked,liger-rows1024,liger-row,liger-rows1024-compiled")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    impls = {"chunked": chunked, "liger-rows1024": liger(1024, False), "liger-row": liger(0, False),
             "liger-rows1024-compiled": liger(1024, True)}
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        w, h, targets, old = inputs(n, args.hidden, args.vocab, device, dtype)
        ref = None
        for name in args.impls.split(","):
            row = {"tokens": n, "impl": name}
            try:
                m = measure(impls[name], w, h, targets, old, device, args.repeats)
            except torch.OutOfMemoryError:
                row["status"] = "oom"
            except Exception as e:  # e.g. torch.compile failing on this torch: a result to record
                row["status"] = f"error: {type(e).__name__}: {str(e)[:200]}"
            else:
                g = m.pop("grad").float()
                if ref is None:
                    ref = {"loss": m["loss"], "grad": g}
                rg = ref["grad"]
                row.update(status="ok", **m, loss_abs_diff=abs(m["loss"] - ref["loss"]),
                           grad_rel_err=float((g - rg).norm() / rg.norm()))
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache() if device.type == "cuda" else None
        del w, h
    lines = ["| tokens | impl | extra peak GiB | median s | |Δloss| vs chunked | grad rel. err |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['tokens']} | {r['impl']} | {r['status'][:40]} | — | — | — |")
        else:
            lines.append(f"| {r['tokens']} | {r['impl']} | {r['extra_peak_gib']:.2f} | {r['median_s'] or 0:.3f} | "
                         f"{r['loss_abs_diff']:.2e} | {r['grad_rel_err']:.2e} |")
    text = "\n".join(lines)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "table": text}, indent=1))


if __name__ == "__main__":
    main()
