"""Start-up of `rlvr train`, this checkout against an earlier commit, alternated in one run:
seconds from launch to the first rollout request, and where the start-up line says they went.

Each run is a fresh process, as a user starts it: `rlvr train <config> trainer.steps=1` into a
new run folder. The first rollout request is the time the run's start-up line states; a run
whose line does not state it (an older commit) has it read off the first metrics record: the
step's end minus its rollout and everything the step did after the rollout (learn, sleep,
wake, sync, probe), which is when it started there. The base side runs from a `git worktree` of the
given commit, with this checkout's environment.

    python -m bench.startup [--base HEAD~1] [--config configs/default.yaml] [--rounds 3] [--json out.json]
                            [dotted.override=value ...]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AFTER_ROLLOUT = ("time_learn_s", "time_sleep_s", "time_wake_s", "time_sync_s", "time_probe_s")


def one_run(tree: Path, config: str, overrides: list[str], uid_base: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-startup-")) / "run"
    launch = time.time()
    out = subprocess.run([sys.executable, "-m", "cli.main", "train", config, "trainer.steps=1",
                          f"trainer.run_dir={run_dir}", f"env.sandbox_uid_base={uid_base}", *overrides],
                         cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
    if out.returncode != 0:
        raise SystemExit(f"run in {tree} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    after = sum(first.get(k, 0.0) for k in AFTER_ROLLOUT)
    line = re.search(r"\[rlvr\] start-up: ([^\n;]*)", out.stdout)
    phases = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)s", line.group(1))} if line else {}
    said = re.search(r"first rollout request ([0-9.]+)s after launch", out.stdout)
    return {"first_request_s": float(said.group(1)) if said else first["time"] - first["time_rollout_s"] - after - launch,
            "first_request_said": said is not None,
            "step1_done_s": first["time"] - launch, "phases": phases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD~1", help="the commit to compare against")
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    base_tree = Path(tempfile.mkdtemp(prefix="bench-startup-base-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=ROOT, check=True,
                   capture_output=True)
    sides = {f"base {args.base}": base_tree, "this checkout": ROOT}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    try:
        for r in range(args.rounds):
            for i, name in enumerate(sides if r % 2 == 0 else list(sides)[::-1]):
                res = one_run(sides[name], args.config, args.overrides, 64000 + 100 * i)
                runs[name].append(res)
                print(f"round {r + 1} {name:>20}: first request {res['first_request_s']:.1f}s, step 1 done "
                      f"{res['step1_done_s']:.1f}s, {res['phases']}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, capture_output=True)
    base = statistics.median(r["first_request_s"] for r in runs[f"base {args.base}"])
    print(f"\n{args.config}, {args.rounds} alternated rounds (load {os.getloadavg()[0]:.1f})")
    print(f"{'side':>20} | {'first request s':>15} | {'ratio':>5} | {'step 1 done s':>13}")
    for name, rs in runs.items():
        first = statistics.median(r["first_request_s"] for r in rs)
        print(f"{name:>20} | {first:>15.1f} | {first / base:>5.2f} | "
              f"{statistics.median(r['step1_done_s'] for r in rs):>13.1f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "load_avg": os.getloadavg()},
                                              indent=2))


if __name__ == "__main__":
    main()
