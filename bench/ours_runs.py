"""Reading a finished (or stopped) `rlvr train` run the benches launched: its start-up to the
first step, each step's time, and the phases of every step, from metrics.jsonl and its console."""
from __future__ import annotations

import json
import re
from pathlib import Path

PHASES = ("time_rollout_s", "time_rollout_wait_s", "time_learn_s", "time_sync_s", "time_sync_hidden_s", "time_probe_s",
          "time_sleep_s", "time_wake_s")


def records(run_dir: Path) -> list[dict]:
    metrics = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []


def ours_result(run_dir: Path, stdout: str, launch: float) -> dict:
    """Start-up (launch -> the first rollout request, as the run's start-up line states it), step
    times (one step's end to the next one's), the first step, rewards, lengths and phases."""
    recs = records(run_dir)
    # a record is written when its step ends; the first step's phases give its start, unless the
    # run says when its first rollout request left (step 1 then rolls out while the learner builds)
    first = recs[0]
    first_step = sum(first.get(k, 0.0) for k in ("time_rollout_s", "time_learn_s", "time_sync_s", "time_probe_s"))
    said = re.search(r"first rollout request ([0-9.]+)s after launch", stdout)
    return {"startup_s": float(said.group(1)) if said else first["time"] - first_step - launch,
            "step_s": [b["time"] - a["time"] for a, b in zip(recs, recs[1:])],
            "first_step_s": first_step, "reward_mean": [r["reward_mean"] for r in recs],
            "completion_tokens_mean": [r["gen_tokens_mean"] for r in recs],
            "phases": [{k: round(r[k], 2) for k in PHASES if k in r} for r in recs]}


def startup_phases(stdout: str) -> dict[str, float]:
    """The run's start-up line (`[rlvr] start-up: ray 3.1s, setup 0.7s, ...`) as {phase: seconds}."""
    said = re.search(r"\[rlvr\] start-up: ([^\n;]*)", stdout)
    return {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)s", said.group(1))} if said else {}
