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
from envs.tasks import load_tasks
from orchestrator.calibrate import BAND_FILE, band_from_records, calibration_tasks, render_band
from rl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CFG = REPO / "configs" / "toolz-native.yaml"


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
                                    "trainer.sampling.dynamic.enabled=true",
                                    "trainer.sampling.dynamic.max_extra_groups=1"])
    try:
        Trainer(cfg, run_dir).run()
    finally:
        ray.shutdown()
    [m] = read_metrics(run_dir)
    assert m["sampling/groups_sampled"] in (1, 2) and m["sampling/groups_kept"] <= 1
    assert 0.0 <= m["band/reward_mean"] <= 1.0 and "frac_reward_zero_std" in m
    trace = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()]
    assert trace and {r["task"] for r in trace} <= set(band["tasks"])


def test_demo_fraction_keeps_demonstrated_calibrated_and_held_out_tasks_disjoint(tmp_path):
    plain, parted = tmp_path / "plain", tmp_path / "parted"
    cfg = load_config(DEFAULT_CFG, ["task.max_tasks=20"])
    whole_train = [t.id for t in select_tasks(cfg.task, cfg.trainer.seed, plain, "train")]
    assert [t.id for t in select_tasks(cfg.task, cfg.trainer.seed, plain, "demo")] == whole_train  # default
    cfg = load_config(DEFAULT_CFG, ["task.max_tasks=20", "task.demo_fraction=0.5"])
    demo = [t.id for t in select_tasks(cfg.task, cfg.trainer.seed, parted, "demo")]
    rl = [t.id for t in calibration_tasks(cfg, parted)]
    test = [t.id for t in select_tasks(cfg.task, cfg.trainer.seed, parted, "test")]
    assert len(demo) == 8 and len(rl) == 8 and sorted(demo + rl) == sorted(whole_train)
    assert not set(demo) & set(rl) and not (set(demo) | set(rl)) & set(test)
    assert test == load_split(plain).test  # the held-out side does not move with demo_fraction
    # a band may hold only calibrated (non-demonstrated) tasks
    band = parted / BAND_FILE
    write_band(band, {"tasks": [demo[0]]})
    with pytest.raises(ConfigError, match="not on this run's training side"):
        select_tasks(cfg.task.model_copy(update={"band_file": str(band)}), cfg.trainer.seed, parted, "train")
    # the split is written once: another demo fraction on the same run is refused
    with pytest.raises(ValueError, match="demo fraction 0.5"):
        select_tasks(cfg.task.model_copy(update={"demo_fraction": 0.25}), cfg.trainer.seed, parted, "train")
    # split files written before the demo side existed still load as "no demo tasks"
    (plain / "split.json").write_text(json.dumps({k: v for k, v in json.loads((plain / "split.json").read_text())
                                                  .items() if not k.startswith("demo")}))
    assert load_split(plain).demo == [] and [t.id for t in select_tasks(
        load_config(DEFAULT_CFG, ["task.max_tasks=20"]).task, 0, plain, "demo")] == whole_train


def test_every_level_of_a_function_stays_on_one_side(tmp_path):
    """A held-out `return` stub of a function whose whole body was demonstrated would be recall."""
    cfg = load_config(DEFAULT_CFG, ["task.tasks_file=configs/tasks/toolz-levels.jsonl", "task.demo_fraction=0.25"])
    sides = {side: select_tasks(cfg.task, cfg.trainer.seed, tmp_path, side) for side in ("demo", "train", "test")}
    functions = {side: {t.function_key for t in ts} for side, ts in sides.items()}
    assert not functions["demo"] & functions["train"] and not functions["test"] & (functions["demo"] | functions["train"])
    total = len(load_tasks(REPO / "configs" / "tasks" / "toolz-levels.jsonl"))
    assert sum(len(t) for t in sides.values()) == total and any(len(ts) > 1 for ts in _by_function(sides["train"]))
    assert 0.75 <= (len(sides["demo"]) + len(sides["train"])) / total <= 0.85   # whole functions: near the fraction


def _by_function(tasks) -> list[list]:
    groups: dict[str, list] = {}
    for t in tasks:
        groups.setdefault(t.function_key, []).append(t)
    return list(groups.values())


def test_band_report_by_level_and_histogram(tmp_path):
    from orchestrator.plots import plot_pass_rates
    records = _recs("a", [1, 0, 0, 0]) + _recs("b", [0, 0, 0, 0]) + _recs("c", [1, 1, 0, 1])
    band = band_from_records(records, ["a", "b", "c"], k=4, lo=0.1, hi=0.9)
    band["levels"] = {"a": "return", "b": "body", "c": "return"}
    text = render_band(band)
    assert "| body | 1 | 0.00 | 0 |" in text and "| return | 2 | 0.50 | 2 |" in text
    png = plot_pass_rates(band, tmp_path / "pass_rates.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000


def test_rl_tasks_demo_trains_on_the_demonstrated_tasks_a_recall_diagnostic(tmp_path):
    cfg = load_config(DEFAULT_CFG, ["task.max_tasks=20", "task.demo_fraction=0.5", "task.rl_tasks=demo"])
    demo = [t.id for t in select_tasks(cfg.task, cfg.trainer.seed, tmp_path, "demo")]
    assert [t.id for t in calibration_tasks(cfg, tmp_path)] == demo
    assert [t.id for t in select_tasks(cfg.task, cfg.trainer.seed, tmp_path, "train")] == demo
    assert not set(demo) & set(load_split(tmp_path).test)


def test_a_reward_band_keeps_partial_credit_tasks_whose_rewards_differ():
    records = _recs("partial", [0, 0.5, 0, 0]) + _recs("alike", [0.5, 0.5, 0.5, 0.5]) + _recs("zero", [0, 0, 0, 0])
    by_pass = band_from_records(records, ["partial", "alike", "zero"], k=4, lo=0.1, hi=0.9)
    by_reward = band_from_records(records, ["partial", "alike", "zero"], k=4, lo=0.1, hi=0.9, by="mean_reward")
    assert by_pass["tasks"] == [] and by_reward["tasks"] == ["partial"]   # "alike" would only give tying groups
    assert "band (mean_reward in [0.1, 0.9]) holds 1" in render_band(by_reward)


def test_max_tasks_spreads_over_files_and_functions():
    """calibrate/eval max_tasks take N tasks across the library's files, not the first N ids
    (sorted ids put one module's functions, every level of each, first)."""
    from envs.split import spread
    tasks = sorted(load_tasks(REPO / "configs" / "tasks" / "toolz-levels.jsonl"), key=lambda t: t.id)
    n_files = len({t.module_path for t in tasks})
    first = tasks[:n_files]
    picked = spread(tasks, n_files, seed=0)
    assert len(picked) == n_files == len({t.id for t in picked})
    assert len({t.module_path for t in picked}) == n_files > len({t.module_path for t in first})
    twice = spread(tasks, 2 * n_files, seed=0)
    assert len({t.function_key for t in twice}) == len(twice)       # no function twice while others wait
    assert [t.id for t in spread(tasks, n_files, seed=0)] == [t.id for t in picked]
    assert [t.id for t in spread(tasks, n_files, seed=1)] != [t.id for t in picked]
    assert spread(tasks, None, 0) == tasks and spread(tasks, len(tasks) + 5, 0) == tasks
