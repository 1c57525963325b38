"""Reward hardening numbers: the tamper table (reward of each attack) and reward latency of
the reference body over a task file (median), on whatever tree is first on the path, so the
same script measures a tree before and after a change side by side.

    python bench/reward_checks.py tamper [--json out.json]
    python bench/reward_checks.py latency [--tasks configs/tasks/toolz.jsonl] [--per-level N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envs.tasks import load_tasks  # noqa: E402
from tests.envs_fixtures import SHIPPED_TOOLZ, episode, replace_body, task_by_qualname  # noqa: E402

UID = 63021


def tamper() -> list[dict]:
    from tests.tamper_attacks import ATTACKS
    task = task_by_qualname(load_tasks(SHIPPED_TOOLZ), "merge")
    rows = []
    for name, attack in [("reference body (must stay 1.0)", lambda env, t: replace_body(env, t.original_body)),
                         *ATTACKS.items()]:
        with episode(task, sandbox_uid_base=UID) as env:
            attack(env, task)
            r = env.reward()
        rows.append({"attack": name, "reward": r.reward, "why": r.error or r.parts.get("reason"),
                     "flags": getattr(r, "flags", [])})
        print(f"{r.reward:5.2f}  {name}  [{(r.error or r.parts.get('reason') or '')[:100]}]", flush=True)
    return rows


def latency(tasks_file: str, per_level: int | None = None) -> dict:
    """per_level: only the first N tasks of each difficulty level (a sample of a large file)."""
    tasks = load_tasks(tasks_file)
    if per_level is not None:
        tasks = [t for lv in dict.fromkeys(t.level for t in tasks) for t in [u for u in tasks if u.level == lv][:per_level]]
    per_task = []
    for task in tasks:
        with episode(task, sandbox_uid_base=UID) as env:
            replace_body(env, task.original_body)
            start = time.monotonic()
            r = env.reward()
            per_task.append({"task": task.id, "level": task.level, "reward": r.reward,
                             "seconds": time.monotonic() - start, "error": r.error})
    secs = [p["seconds"] for p in per_task]
    out = {"tasks": len(per_task), "median_s": statistics.median(secs), "mean_s": statistics.mean(secs),
           "not_full": [p for p in per_task if p["reward"] != 1.0], "per_task": per_task}
    print(f"{len(per_task)} tasks: median {out['median_s']:.2f} s, mean {out['mean_s']:.2f} s; "
          f"reference body below 1.0 on {len(out['not_full'])}: {[p['task'] for p in out['not_full']][:10]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["tamper", "latency"])
    ap.add_argument("--tasks", default=str(SHIPPED_TOOLZ))
    ap.add_argument("--per-level", type=int, default=None, help="latency: first N tasks of each level")
    ap.add_argument("--json")
    args = ap.parse_args()
    result = tamper() if args.what == "tamper" else latency(args.tasks, args.per_level)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
