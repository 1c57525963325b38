"""Calibration: per-task pass rates from evaluation records, the band file, and the band
restricting training to the run's training side; end to end on the real stack (heavy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.split import load_split, select_tasks, write_band
from orchestrator.calibrate import BAND_FILE, band_from_records, calibration_tasks, render_band
from rl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CFG = REPO / "configs" / "default.yaml"


def _recs(task: str, rewards: list[float]) -> list[dict]:
    return [{"task": task, "sample": i, "reward": r} for i, r in enumerate(rewards)]


def test_band_from_records():
    records = (_recs("easy", [1, 1, 1, 1]) + _recs("mid", [1, 0, 0.5, 1]) + _recs("hard", [0, 0, 0.5, 0])
               + _recs("some", [0, 0, 0, 1]) + _recs("short", [1]))
    band = band_from_records(records, ["easy", "mid", "hard", "some", "short", "never"], k=4, lo=0.1, hi=0.9)
    assert band["tasks"] == ["mid", "some"]
    assert band["incomplete"] == ["short", "never"] and band["calibrated"] == 4
    mid = band["per_task"]["mid"]
    assert (mid["passes"], mid["pass_rate"], mid["mean_reward"], mid["pass@4"]) == (2, 0.5, 0.625, 1.0)
    assert band["per_task"]["hard"]["pass@4"] == 0.0 and band["per_task"]["hard"]["mean_reward"] == 0.125
    assert band["mean_pass_rate"] == pytest.approx((1 + 0.5 + 0 + 0.25) / 4)
    assert "| mid | 0.50 | 0.625 | 1.00 | yes |" in render_band(band)
    with pytest.raises(ValueError, match="calibrate.lo"):
        load_config(None, ["calibrate.lo=0.8", "calibrate.hi=0.2"])


def test_band_file_restricts_training_to_the_training_side(tmp_path):
    cfg = load_config(DEFAULT_CFG, ["task.max_tasks=20"])
    train = select_tasks(cfg.task, cfg.trainer.seed, tmp_path, "train")
    split = load_split(tmp_path)
    band = tmp_path / BAND_FILE
    write_band(band, {"tasks": [train[3].id, train[1].id]})
    banded = cfg.task.model_copy(update={"band_file": str(band)})
    assert [t.id for t in select_tasks(banded, cfg.trainer.seed, tmp_path, "train")] == [train[1].id, train[3].id]
    assert [t.id for t in select_tasks(banded, cfg.trainer.seed, tmp_path, "test")] == split.test  # untouched
    # calibration always sees the whole training side, never a held-out task
    cal = [t.id for t in calibration_tasks(cfg.model_copy(update={"task": banded}), tmp_path)]
    assert cal == split.train and not set(cal) & set(split.test)
    write_band(band, {"tasks": [train[0].id, split.test[0]]})
    with pytest.raises(ConfigError, match="not on this run's training side"):
        select_tasks(banded, cfg.trainer.seed, tmp_path, "train")
    write_band(band, {"tasks": []})
    with pytest.raises(ConfigError, match="holds no task"):
        select_tasks(banded, cfg.trainer.seed, tmp_path, "train")
    band.write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        select_tasks(banded, cfg.trainer.seed, tmp_path, "train")


# ---- end to end: rlvr calibrate (pi, real sandbox) -> band -> one GRPO step on the band ---------
WORK_ROOT = "/tmp/agentic-rlvr-test-calibrate"
ENV = ["env.pool_size=2", "env.sandbox_uid_base=64700", f"env.work_root={WORK_ROOT}", "task.max_tasks=10",
       "rollout.max_tokens=96", "scaffold.max_turns=2", "scaffold.wall_clock_s=240"]


@pytest.mark.heavy
def test_calibration_band_and_a_grpo_step_end_to_end(tmp_path, model_path):
    import ray

    from orchestrator.evaluator import Evaluator
    from orchestrator.loop import Trainer
    from orchestrator.metrics import read_metrics

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "cli.main", "calibrate", str(DEFAULT_CFG), *ENV, "calibrate.k=2",
           "calibrate.max_tasks=2", "calibrate.lo=0.0", "calibrate.hi=1.0", "--run-dir", str(run_dir)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    band = json.loads((run_dir / BAND_FILE).read_text())
    split = load_split(run_dir)
    assert band["calibrated"] == 2 and band["k"] == 2 and band["policy"]["scaffold"] == "pi"
    assert set(band["tasks"]) == set(band["per_task"]) and set(band["tasks"]) <= set(split.train)
    records = [json.loads(line) for line in (run_dir / "calibration" / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["scaffold"] for r in records} == {"pi"}
    assert not {r["task"] for r in records} & set(split.test)
    # a rerun would run nothing: every (task, sample) has its record (the evaluator's resume rule)
    cal_cfg = load_config(DEFAULT_CFG, [*ENV, "calibrate.k=2", "calibrate.max_tasks=2"])
    assert Evaluator(cal_cfg, str(run_dir / "calibration")).pending(calibration_tasks(cal_cfg, run_dir), 2) == []

    cfg = load_config(DEFAULT_CFG, [*ENV, f"trainer.run_dir={run_dir}", f"task.band_file={run_dir / BAND_FILE}",
                                    "trainer.steps=1", "trainer.batch_size=1", "trainer.group_size=2",
                                    "trainer.dynamic_sampling.enabled=true",
                                    "trainer.dynamic_sampling.max_extra_groups=1"])
    try:
        Trainer(cfg, run_dir).run()
    finally:
        ray.shutdown()
    [m] = read_metrics(run_dir)
    assert m["sampling/groups_sampled"] in (1, 2) and m["sampling/groups_kept"] <= 1
    assert 0.0 <= m["band/reward_mean"] <= 1.0 and "frac_reward_zero_std" in m
    trace = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()]
    assert trace and {r["task"] for r in trace} <= set(band["tasks"])
