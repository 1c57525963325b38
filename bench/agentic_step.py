"""The main job's rollout phase, before vs after, side by side in one run: generated tokens
per rollout wall-second, the time budget by part, and each side's parity gap.

Each side serves the model through its own RolloutWorker and env actor in one Ray and rolls
out the same groups (the step cursor's tasks, the same engine seed); the sides alternate
within every round so background load hits both alike.

    before: rollout.guided_logprobs=rescore, rollout.dtype=model (the served log-probs of a
            guided call come from a second prompt-log-prob pass; fp32 on CPU)
    after:  the config as given (configs/default.yaml), plus any --after overrides

Also measured: each worker's start-up, the parity gap of its served policy to one learner
(the same fixed text the run probes), and how far the log-probs its episodes recorded are
from the learner's on the same tokens (tokens left to the learner count as equal).

    python bench/agentic_step.py [--config configs/default.yaml] [--rounds 2] [--groups 1]
                                 [--after rollout.dtype=bfloat16 ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BEFORE = ["rollout.guided_logprobs=rescore", "rollout.dtype=model"]


class Side:
    """One configuration's worker, env actor and rollout source."""

    def __init__(self, name: str, cfg, model_path: str, run_dir: Path):
        import ray

        from orchestrator.cluster import spawn_rollout_workers
        from orchestrator.rollouts.agentic import AgenticRollouts
        self.name, self.cfg = name, cfg
        run_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self.workers = spawn_rollout_workers(cfg, model_path)
        ray.get([w.chat_template_info.remote() for w in self.workers])
        self.startup_s = time.perf_counter() - t0
        self.rollouts = AgenticRollouts(cfg, run_dir, self.workers, None)
        self.runs: list[dict] = []
        self.last_episodes: list = []

    def roll_out(self, round_no: int, groups: int) -> dict:
        from orchestrator.metrics import step_time_budget
        from orchestrator.rollouts.base import step_group_specs
        names = [t.id for t in self.rollouts.train_tasks]
        specs = step_group_specs(round_no, groups, self.cfg.trainer.seed, names)
        episodes: list = []
        t0 = time.perf_counter()
        self.rollouts.run_groups(specs, round_no, episodes.extend)
        wall = time.perf_counter() - t0
        records = [e.record for e in episodes]
        tokens = sum(r.tokens for r in records)
        row = {"side": self.name, "round": round_no, "rollout_s": wall, "gen_tokens": tokens,
               "gen_tokens_per_s": tokens / wall, "episodes": len(records),
               "calls": sum(r.calls or 0 for r in records), "reward_mean": sum(r.reward for r in records) / len(records),
               "errors": sum(r.stop_reason == "error" for r in records),
               **step_time_budget(records, wall, {})}
        self.runs.append(row)
        self.last_episodes = episodes
        return row


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


def summarize(side: Side) -> dict:
    wall = sum(r["rollout_s"] for r in side.runs)
    tokens = sum(r["gen_tokens"] for r in side.runs)
    parts = {k: sum(r.get(k, 0.0) for r in side.runs) for r in side.runs for k in r if k.startswith("time/")}
    return {"rollout_s": wall, "gen_tokens": tokens, "gen_tokens_per_s": tokens / wall,
            "episodes": sum(r["episodes"] for r in side.runs), "calls": sum(r["calls"] for r in side.runs),
            "time_share": {k[5:-2]: v / wall for k, v in parts.items()}, "startup_s": side.startup_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--groups", type=int, default=None, help="groups per round (default: trainer.batch_size)")
    ap.add_argument("--after", nargs="*", default=[], help="overrides for the 'after' side")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import ray

    from actors.learner import Learner
    from orchestrator.parity import parity_gap
    from rl.config import load_config
    from rl.default_model import resolve_model_path

    after_cfg = load_config(args.config, args.after)
    before_cfg = load_config(args.config, args.after + BEFORE)
    groups = args.groups or after_cfg.trainer.batch_size
    model_path = resolve_model_path(after_cfg.model.path)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-agentic-"))
    sides = [Side("before", before_cfg, model_path, run_dir / "before"),
             Side("after", after_cfg, model_path, run_dir / "after")]
    for r in range(1, args.rounds + 1):
        for side in (sides if r % 2 else sides[::-1]):
            row = side.roll_out(r, groups)
            print(f"round {r} {side.name:>6}: {row['gen_tokens']} tokens in {row['rollout_s']:.1f}s "
                  f"= {row['gen_tokens_per_s']:.2f} tok/s ({row['calls']} calls, {row['errors']} errors)", flush=True)

    from transformers import AutoTokenizer
    learner = Learner(model_path, after_cfg.learner, after_cfg.model, seed=0)
    parity_ids = AutoTokenizer.from_pretrained(model_path)(after_cfg.sync.parity_text)["input_ids"]
    learner_lp = learner.sequence_logprobs(parity_ids)
    results = {}
    for side in sides:
        served = ray.get(side.workers[0].prompt_logprobs.remote(parity_ids))
        mean_gap, max_gap = parity_gap(learner_lp, served)
        results[side.name] = {**summarize(side), "parity_gap": mean_gap, "parity_gap_max": max_gap,
                              "recorded_vs_learner": recorded_vs_learner(learner, side.last_episodes),
                              "overrides": BEFORE + args.after if side.name == "before" else args.after}
    b, a = results["before"], results["after"]
    ratio = a["gen_tokens_per_s"] / b["gen_tokens_per_s"]

    print(f"\n{args.config}: {args.rounds} rounds x {groups} group(s) x {after_cfg.trainer.group_size} episodes "
          f"per side ({platform.node()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f})")
    print(f"{'':>22} | {'before':>10} | {'after':>10}")
    print("-" * 48)
    for key, fmt in (("gen_tokens", "{:.0f}"), ("rollout_s", "{:.1f}"), ("gen_tokens_per_s", "{:.2f}"),
                     ("calls", "{:.0f}"), ("startup_s", "{:.1f}"), ("parity_gap", "{:.4f}")):
        print(f"{key:>22} | {fmt.format(b[key]):>10} | {fmt.format(a[key]):>10}")
    for side in ("before", "after"):
        rv = results[side]["recorded_vs_learner"]
        print(f"{'recorded-learner ' + side:>22} | mean {rv['mean_abs_gap']:.4f} max {rv['max_abs_gap']:.4f} "
              f"over {rv['tokens']} tokens ({rv['left_to_learner']} left to the learner)")
    print("\nshare of rollout wall time by part:")
    for part in sorted(set(b["time_share"]) | set(a["time_share"]), key=lambda p: -b["time_share"].get(p, 0)):
        print(f"{part:>22} | {100 * b['time_share'].get(part, 0):>9.1f}% | {100 * a['time_share'].get(part, 0):>9.1f}%")
    print(f"\nafter/before gen tokens per rollout-second: {ratio:.2f}x")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "groups": groups, "ratio": ratio,
                                               "load_avg": os.getloadavg(), "sides": results,
                                               "rounds": [row for s in sides for row in s.runs]}, indent=2))
    ray.shutdown()


if __name__ == "__main__":
    main()
