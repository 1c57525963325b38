"""Reward latency of two trees side by side, interleaved task by task: on a shared machine the
load moves within minutes, so two runs one after the other measure the load as much as the
trees. One worker process per tree (its own code and its own task file, run from its root)
scores the reference body of task i; the order alternates (A B, then B A) from task to task.

    python -m bench.latency_ab BEFORE_TREE AFTER_TREE [--tasks configs/tasks/toolz.jsonl] [--uid N] [--json out]

Only the reward is timed (`env.reward()`, as `reward_checks latency` does); both trees must
have tests/fixtures/env.py's `episode` and `replace_body`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKER = r"""
import json, sys, time
from envs.tasks import load_tasks
from tests.fixtures.env import episode, replace_body
tasks = load_tasks(sys.argv[1])
uid = int(sys.argv[2])
print(json.dumps({"tasks": len(tasks)}), flush=True)
for line in sys.stdin:
    task = tasks[int(line)]
    with episode(task, sandbox_uid_base=uid) as env:
        replace_body(env, task.original_body)
        start = time.monotonic()
        r = env.reward()
        seconds = time.monotonic() - start
    print(json.dumps({"task": task.id, "seconds": seconds, "reward": r.reward, "error": r.error,
                      "gate": (r.parts.get("gate") or {}).get("inputs", 0)}), flush=True)
"""


def _load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs=2, help="the two trees (before, after)")
    ap.add_argument("--tasks", default="configs/tasks/toolz.jsonl", help="relative to each tree")
    ap.add_argument("--uid", type=int, default=64900)
    ap.add_argument("--json")
    args = ap.parse_args()
    workers = []
    for n, tree in enumerate(args.trees):
        root = Path(tree).resolve()
        p = subprocess.Popen([sys.executable, "-c", WORKER, args.tasks, str(args.uid + n)], cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)}, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        workers.append((str(root), p, json.loads(p.stdout.readline())["tasks"]))
    n_tasks = min(w[2] for w in workers)
    rows: dict[str, list] = {w[0]: [] for w in workers}
    try:
        for i in range(n_tasks):
            for root, p, _ in (workers if i % 2 == 0 else workers[::-1]):
                p.stdin.write(f"{i}\n")
                p.stdin.flush()
                rec = json.loads(p.stdout.readline())
                rec["load"] = _load()
                rows[root].append(rec)
            print(f"{i:3d} " + "  ".join(f"{rows[w[0]][-1]['seconds']:.2f}s" for w in workers)
                  + f"  load {_load()}  {rows[workers[0][0]][-1]['task']}", flush=True)
    finally:
        for _, p, _ in workers:
            p.stdin.close()
            p.wait()
    out = {"order": "interleaved, alternating per task", "started": time.strftime("%Y-%m-%d %H:%M:%S"), "trees": {}}
    for root, recs in rows.items():
        secs = [r["seconds"] for r in recs]
        out["trees"][root] = {"tasks": len(recs), "median_s": statistics.median(secs), "mean_s": statistics.mean(secs),
                              "not_full": [r["task"] for r in recs if r["reward"] != 1.0], "per_task": recs}
    before, after = (out["trees"][w[0]] for w in workers)
    ratios = [a["seconds"] / b["seconds"] for a, b in zip(after["per_task"], before["per_task"])]
    out["after_over_before"] = {"medians": after["median_s"] / before["median_s"],
                                "median_per_task_ratio": statistics.median(ratios)}
    for root, t in out["trees"].items():
        print(f"{root}: {t['tasks']} tasks, median {t['median_s']:.3f} s, mean {t['mean_s']:.3f} s, "
              f"below 1.0: {t['not_full'][:5]}")
    print(f"after / before: medians {out['after_over_before']['medians']:.3f}, "
          f"median per-task ratio {out['after_over_before']['median_per_task_ratio']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
