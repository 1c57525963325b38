"""Seconds of one learner update on a run's recorded episodes, per learner layout.

A pi episode is a long context (pi's system prompt, ~2.5k tokens, plus tool output) around a
few hundred generated tokens, and every episode of a group starts with the same prompt; the
update's cost is its context. This replays one stored step (the episodes as the learner got
them, group advantages as the loop computes them) through the project's Learner under each
variant, alternated over --rounds in one process, and prints a table.

  python -m bench.learner_layouts runs/default/episodes/step_000001.jsonl --model <model folder> \\
      --json docs/results/learner-layouts-cpu/step1.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

VARIANTS = {  # name: LearnerConfig overrides (the rest as configs/default.yaml sets them)
    "padded+ckpt+fp32": {"gradient_checkpointing": True, "cpu_bf16": False, "micro_batch_tokens": 2048},
    "padded+ckpt": {"gradient_checkpointing": True, "micro_batch_tokens": 2048},
    "padded": {"gradient_checkpointing": False, "micro_batch_tokens": 2048},
    "shared_prefix+ckpt": {"gradient_checkpointing": True, "layout": "shared_prefix", "micro_batch_tokens": 32768},
    "shared_prefix": {"gradient_checkpointing": False, "layout": "shared_prefix", "micro_batch_tokens": 32768},
}


def load_samples(path: Path):
    from orchestrator.rollouts.base import Episode
    from rl.advantages import group_advantages
    from rl.jsonl import read_complete
    from rl.types import TrainSample

    episodes = [Episode.from_json(e) for line in read_complete(path) for e in line]
    adv = group_advantages([e.reward for e in episodes], [e.group_id for e in episodes])
    return [TrainSample(s.token_ids, s.loss_mask, s.logprobs, advantage=a, group_id=e.group_id)
            for e, a in zip(episodes, adv) for s in e.sequences if a != 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("episodes", type=Path, help="a run's episodes/step_NNNNNN.jsonl")
    ap.add_argument("--model", required=True, help="the model folder the run trained")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from actors.learner import Learner
    from rl.config import LearnerConfig, ModelConfig

    samples = load_samples(args.episodes)
    if not samples:
        raise SystemExit(f"{args.episodes}: no episode with a nonzero advantage (every group tied)")
    tokens = sum(len(s.token_ids) for s in samples)
    trained = sum(sum(s.loss_mask) for s in samples)
    print(f"{len(samples)} samples, {tokens} tokens ({trained} trained) from {args.episodes}", flush=True)
    names = args.variants.split(",")
    times: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, float] = {}
    for r in range(args.rounds):
        for name in names:
            cfg = LearnerConfig(**{"torch_threads": args.threads, "loss_agg": "token_mean", "tis_cap": 2.0,
                                   "cpu_bf16": True, **VARIANTS[name]})
            learner = Learner(args.model, cfg, ModelConfig(path=args.model), seed=0)
            t0 = time.perf_counter()
            out = learner.train_step(samples)
            times[name].append(time.perf_counter() - t0)
            losses[name] = out.get("loss")
            print(f"round {r + 1} {name}: {times[name][-1]:.1f}s loss {losses[name]:.5f}", flush=True)
            del learner
    base = statistics.median(times[names[0]])
    print(f"\n{'variant':22s} {'median s':>9s} {'tokens/s':>9s} {'vs ' + names[0]:>24s}  loss")
    rows = []
    for n in names:
        med = statistics.median(times[n])
        rows.append({"variant": n, "seconds": times[n], "median_s": med, "tokens_per_s": tokens / med,
                     "speedup": base / med, "loss": losses[n], "overrides": VARIANTS[n]})
        print(f"{n:22s} {med:9.1f} {tokens / med:9.0f} {base / med:23.2f}x  {losses[n]:.5f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"episodes": str(args.episodes), "samples": len(samples), "tokens": tokens,
                                         "trained_tokens": trained, "threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
