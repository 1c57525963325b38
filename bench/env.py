"""Benchmark the coding environment on this machine: mining time per library, reward
latency, sandbox overhead per command, and environments built per second.

    python -m bench.env [--libraries toolz,cachetools] [--mine-limit N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from envs.coding_env import CodingEnv
from envs.mining import mine
from envs.sandbox import Limits, QuotaDir, Sandbox, chown_tree
from envs.tasks import load_tasks
from rl.config import EnvConfig

WORK = Path("/tmp/agentic-rlvr-bench")


def bench_sandbox(n: int) -> dict:
    WORK.mkdir(parents=True, exist_ok=True)
    q = QuotaDir(WORK / f"sbx-{time.monotonic_ns()}", 64)
    (q.path / "repo").mkdir()
    chown_tree(q.path, 64500)
    sandbox = Sandbox(q.path / "repo", uid=64500, limits=Limits())
    try:
        sandboxed, plain = [], []
        for _ in range(n):
            t = time.monotonic()
            res = sandbox.run("true", 10)
            sandboxed.append(time.monotonic() - t)
            assert res.exit_code == 0, res.output
            t = time.monotonic()
            subprocess.run(["bash", "-c", "true"], check=True)
            plain.append(time.monotonic() - t)
        py_s, py_p = [], []
        for _ in range(max(3, n // 5)):
            t = time.monotonic()
            sandbox.run("python -c pass", 10)
            py_s.append(time.monotonic() - t)
            t = time.monotonic()
            subprocess.run(["/opt/agentic-rlvr/sandbox-venv/bin/python", "-c", "pass"], check=True)
            py_p.append(time.monotonic() - t)
    finally:
        q.close()
    med = statistics.median
    return {"true_sandboxed_ms": 1000 * med(sandboxed), "true_plain_ms": 1000 * med(plain),
            "overhead_ms": 1000 * (med(sandboxed) - med(plain)),
            "python_sandboxed_ms": 1000 * med(py_s), "python_plain_ms": 1000 * med(py_p)}


def bench_envs(task, cfg: EnvConfig, n: int) -> dict:
    t = time.monotonic()
    for _ in range(n):
        CodingEnv(task, cfg.work_root, cfg).close()
    dt = time.monotonic() - t
    return {"envs_per_s": n / dt, "env_build_close_ms": 1000 * dt / n}


def bench_reward(task, cfg: EnvConfig, n: int) -> dict:
    times, rewards = [], []
    for _ in range(n):
        env = CodingEnv(task, cfg.work_root, cfg)
        try:
            env.call_tool("edit", {"path": task.module_path,
                                   "edits": [{"oldText": task.stub_body, "newText": task.original_body}]})
            t = time.monotonic()
            r = env.reward()
            times.append(time.monotonic() - t)
            rewards.append(r.reward)
        finally:
            env.close()
    return {"reward_median_s": statistics.median(times), "reward_max_s": max(times),
            "reward_min_s": min(times), "rewards": sorted(set(rewards))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libraries", default="toolz")
    ap.add_argument("--mine-limit", type=int, default=None, help="probe at most N functions per library")
    ap.add_argument("--tasks", default="configs/tasks/toolz.jsonl")
    ap.add_argument("--reward-runs", type=int, default=8)
    ap.add_argument("--commands", type=int, default=30)
    ap.add_argument("--envs", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results: dict = {"mining": {}}
    for lib in [x for x in args.libraries.split(",") if x]:
        tasks, report = mine(lib, limit=args.mine_limit, work_root=WORK, log=lambda m: None)
        results["mining"][lib] = {"seconds": report.seconds, "tasks": report.tasks,
                                  "functions": report.functions, "stable_tests": report.stable_tests,
                                  "dropped": report.dropped}
    results["sandbox"] = bench_sandbox(args.commands)
    cfg = EnvConfig(work_root=str(WORK))
    task = next(t for t in load_tasks(args.tasks) if t.qualname == "merge")
    results["envs"] = bench_envs(task, cfg, args.envs)
    results["reward"] = bench_reward(task, cfg, args.reward_runs)

    print(f"{'metric':<40} {'value':>12}")
    print("-" * 53)
    for lib, m in results["mining"].items():
        print(f"{'mining ' + lib + ' (s)':<40} {m['seconds']:>12.1f}")
        print(f"{'  tasks / functions':<40} {str(m['tasks']) + ' / ' + str(m['functions']):>12}")
    s = results["sandbox"]
    print(f"{'sandboxed `true` (ms, median)':<40} {s['true_sandboxed_ms']:>12.1f}")
    print(f"{'unsandboxed `true` (ms, median)':<40} {s['true_plain_ms']:>12.1f}")
    print(f"{'sandbox overhead per command (ms)':<40} {s['overhead_ms']:>12.1f}")
    print(f"{'python -c pass sandboxed/plain (ms)':<40} {s['python_sandboxed_ms']:>6.0f}/{s['python_plain_ms']:<5.0f}")
    e = results["envs"]
    print(f"{'environments built+closed per second':<40} {e['envs_per_s']:>12.2f}")
    r = results["reward"]
    print(f"{'reward latency median (s)':<40} {r['reward_median_s']:>12.2f}")
    print(f"{'reward latency max (s)':<40} {r['reward_max_s']:>12.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
