"""The main job's rollout phase, before vs after, side by side in one run: generated tokens
per rollout wall-second and the time budget by part.

Each side has its own RolloutWorker (built from its own config) and env actor; both roll out
the same groups (the step cursor's tasks); the sides alternate within every round so
background load hits both alike, and each run starts from a cold prefix cache.

    before: the main job as it was: fp32 serving, and each guided call's log-probs from a
            second, uncached prompt-log-prob pass (--before overrides; default
            `rollout.dtype=float32 rollout.guided_logprobs=rescore`)
    after:  the config as it is (--after overrides: none by default)

Also measured: each worker's start-up, each served policy's parity gap to a learner on the
run's probe text, and how far the log-probs each side's episodes recorded are from the
learner's on the same tokens.

    python -m bench.agentic_step [--config configs/default.yaml] [--rounds 2] [--groups 1]
                                 [--before "k=v ..."] [--after "k=v ..."] [--json out.json]
                                 [dotted.override=value ...]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import ray

BEFORE = "rollout.dtype=float32 rollout.guided_logprobs=rescore"


def _cold(worker) -> None:
    """Start a run from a cold prefix cache."""
    ray.get(worker.__ray_call__.remote(lambda w: w.loop.call(lambda engine: engine.reset_prefix_cache())))


def roll_out(rollouts, worker, side: str, round_no: int, groups: int, seed: int) -> tuple[dict, list]:
    from orchestrator.metrics import step_time_budget
    from orchestrator.rollouts.base import GroupSpec, step_group_specs
    _cold(worker)
    # the same tasks for both sides; ids prefixed by the side, so the trace tells them apart
    specs = [GroupSpec(f"{side}-{s.group_id}", s.index)
             for s in step_group_specs(round_no, groups, seed, [t.id for t in rollouts.train_tasks])]
    episodes: list = []
    t0 = time.perf_counter()
    rollouts.run_groups(specs, round_no, episodes.extend)
    wall = time.perf_counter() - t0
    records = [e.record for e in episodes]
    tokens = sum(r.tokens for r in records)
    row = {"side": side, "round": round_no, "rollout_s": wall, "gen_tokens": tokens,
           "gen_tokens_per_s": tokens / wall, "episodes": len(records),
           "calls": sum(r.calls or 0 for r in records), "reward_mean": sum(r.reward for r in records) / len(records),
           "errors": sum(r.stop_reason == "error" for r in records),
           "prompt_tokens": sum(r.prompt_tokens or 0 for r in records),
           "cached_tokens": sum(r.cached_tokens or 0 for r in records), **step_time_budget(records, wall, {})}
    return row, episodes


def recorded_vs_learner(learner, episodes, limit: int = 4) -> dict:
    """Mean |recorded - learner| over generated tokens of a few sequences; NaN (left to the
    learner) counts as equal, and their share is reported."""
    diffs, left = [], 0
    for seq in [s for e in episodes for s in e.sequences][:limit]:
        ref = learner.sequence_logprobs(seq.token_ids)
        for lp, r, m in zip(seq.logprobs, ref, seq.loss_mask):
            if not m:
                continue
            if math.isnan(lp):
                left += 1
                diffs.append(0.0)
            else:
                diffs.append(abs(lp - r))
    return {"tokens": len(diffs), "left_to_learner": left,
            "mean_abs_gap": sum(diffs) / max(len(diffs), 1), "max_abs_gap": max(diffs, default=0.0)}


def summarize(rows: list[dict]) -> dict:
    wall = sum(r["rollout_s"] for r in rows)
    tokens = sum(r["gen_tokens"] for r in rows)
    parts = {k: sum(r.get(k, 0.0) for r in rows) for r in rows for k in r if k.startswith("time/")}
    return {"rollout_s": wall, "gen_tokens": tokens, "gen_tokens_per_s": tokens / wall,
            "episodes": sum(r["episodes"] for r in rows), "calls": sum(r["calls"] for r in rows),
            "prefix_cache_hit_rate": sum(r["cached_tokens"] for r in rows) / max(sum(r["prompt_tokens"] for r in rows), 1),
            "in_flight": sum(r.get("rollout/episodes_in_flight", 0.0) * r["rollout_s"] for r in rows) / wall,
            "time_share": {k[5:-2]: v / wall for k, v in parts.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--groups", type=int, default=None, help="groups per round (default: trainer.batch_size)")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for both sides")
    ap.add_argument("--before", default=BEFORE, help="overrides of the before side (space-separated)")
    ap.add_argument("--after", default="", help="overrides of the after side (space-separated)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    from actors.learner import Learner
    from modeling.default_model import resolve_model_path
    from orchestrator.cluster import spawn_rollout_workers
    from orchestrator.parity import parity_gap
    from orchestrator.rollouts.agentic import AgenticRollouts
    from rl.config import load_config

    sides = {"before": args.before.split(), "after": args.after.split()}
    cfgs = {side: load_config(args.config, [*args.overrides, *extra]) for side, extra in sides.items()}
    base_uid = cfgs["before"].env.sandbox_uid_base  # each side's env actor gets its own sandbox users
    cfgs["before"].env.sandbox_uid_base = base_uid + cfgs["before"].env.pool_size * cfgs["before"].env.num_env_actors
    cfg = cfgs["after"]
    groups = args.groups or cfg.trainer.batch_size
    model_path = resolve_model_path(cfg.model.path)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    workers, rollouts, startup = {}, {}, {}
    for side, side_cfg in cfgs.items():
        t0 = time.perf_counter()
        [workers[side]] = spawn_rollout_workers(side_cfg, model_path, count=1)
        ray.get(workers[side].chat_template_info.remote())
        startup[side] = time.perf_counter() - t0
        rollouts[side] = AgenticRollouts(side_cfg, Path(tempfile.mkdtemp(prefix=f"bench-agentic-{side}-")),
                                         [workers[side]], None)
    rows: dict[str, list[dict]] = {side: [] for side in sides}
    last: dict[str, list] = {}
    for r in range(1, args.rounds + 1):
        for side in (list(sides) if r % 2 else list(sides)[::-1]):
            row, last[side] = roll_out(rollouts[side], workers[side], side, r, groups, cfg.trainer.seed)
            rows[side].append(row)
            print(f"round {r} {side:>6}: {row['gen_tokens']} tokens in {row['rollout_s']:.1f}s "
                  f"= {row['gen_tokens_per_s']:.2f} tok/s ({row['calls']} calls, {row['errors']} errors)", flush=True)
            if args.json:  # raw rows as they come: a run cut short (e.g. by the OOM killer) keeps them
                _write(args.json, {"args": vars(args), "partial": True, "rows": rows})

    from transformers import AutoTokenizer
    learner = Learner(model_path, cfg.learner, cfg.model, seed=0, lora=cfg.lora)
    parity_ids = AutoTokenizer.from_pretrained(model_path)(cfg.sync.parity_text)["input_ids"]
    learner_lp = learner.sequence_logprobs(parity_ids)
    results = {}
    for side in sides:
        mean_gap, max_gap = parity_gap(learner_lp, ray.get(workers[side].prompt_logprobs.remote(parity_ids)))
        results[side] = {**summarize(rows[side]), "overrides": sides[side], "startup_s": startup[side],
                         "served_dtype": cfgs[side].rollout.dtype, "parity_gap": mean_gap, "parity_gap_max": max_gap,
                         "recorded_vs_learner": recorded_vs_learner(learner, last[side])}
    b, a = results["before"], results["after"]
    ratio = a["gen_tokens_per_s"] / b["gen_tokens_per_s"]

    print(f"\n{args.config} {' '.join(args.overrides)}: {args.rounds} rounds x {groups} group(s) x "
          f"{cfg.trainer.group_size} episodes per side ({platform.node()}, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}); before: {' '.join(sides['before']) or '(config)'}; "
          f"after: {' '.join(sides['after']) or '(config)'}")
    print(f"{'':>22} | {'before':>10} | {'after':>10}")
    print("-" * 48)
    for key, fmt in (("gen_tokens", "{:.0f}"), ("rollout_s", "{:.1f}"), ("gen_tokens_per_s", "{:.2f}"),
                     ("calls", "{:.0f}"), ("prefix_cache_hit_rate", "{:.2f}"), ("in_flight", "{:.1f}"),
                     ("startup_s", "{:.1f}"), ("parity_gap", "{:.4f}"),
                     ("parity_gap_max", "{:.4f}")):
        print(f"{key:>22} | {fmt.format(b[key]):>10} | {fmt.format(a[key]):>10}")
    print(f"(parity threshold {cfg.sync.parity_threshold}; served dtype before {b['served_dtype']}, "
          f"after {a['served_dtype']})")
    for side in sides:
        rv = results[side]["recorded_vs_learner"]
        print(f"recorded vs learner, {side}: mean {rv['mean_abs_gap']:.4f} max {rv['max_abs_gap']:.4f} "
              f"over {rv['tokens']} tokens ({rv['left_to_learner']} left to the learner)")
    print("\nshare of rollout wall time by part:")
    for part in sorted(set(b["time_share"]) | set(a["time_share"]), key=lambda p: -b["time_share"].get(p, 0)):
        print(f"{part:>22} | {100 * b['time_share'].get(part, 0):>9.1f}% | {100 * a['time_share'].get(part, 0):>9.1f}%")
    print(f"\nafter/before gen tokens per rollout-second: {ratio:.2f}x")
    if args.json:
        _write(args.json, {"args": vars(args), "ratio": ratio, "load_avg": os.getloadavg(), "sides": results,
                           "rows": rows})
    ray.shutdown()


def _write(path: str, data: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
