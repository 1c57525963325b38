"""Evaluation: raw records are the truth, reports are recomputed from them, and a killed
evaluation resumes without losing or re-running a finished episode."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.eval_report import RECORDS_FILE, append_record, load_records, summarize, write_report
from rl.jsonl import repair_tail

REPO = Path(__file__).resolve().parents[2]
WORK_ROOT = "/tmp/agentic-rlvr-test-eval"


def _rec(task: str, sample: int, reward: float, **extra) -> dict:
    return {"task": task, "sample": sample, "reward": reward, "turns": 2, "tool_calls": 2,
            "tool_failures": 1, "stop_reason": "stop", "seconds": 3.0, "edited": reward > 0, **extra}


def test_single_shot_vs_best_of_n_from_records():
    records = [_rec("a", 0, 0.0), _rec("a", 1, 1.0), _rec("a", 2, 0.5),
               _rec("b", 0, 0.2), _rec("b", 1, 0.0), _rec("b", 2, 0.0),
               _rec("c", 0, 1.0), _rec("c", 1, 1.0), _rec("c", 2, 1.0)]
    s = summarize(records)
    assert (s["tasks"], s["episodes"], s["samples_per_task"]) == (3, 9, 3)
    assert s["single_shot_pass_rate"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert s["best_of_n_pass_rate"] == pytest.approx(2 / 3)
    assert s["best_of_n_mean_reward"] == pytest.approx((1.0 + 0.2 + 1.0) / 3)
    assert s["single_shot_mean_reward"] == pytest.approx((0.5 + 0.2 / 3 + 1.0) / 3)
    per = {t["task"]: t for t in s["per_task"]}
    assert per["a"]["best_sample"] == 1 and per["b"]["best_reward"] == 0.2
    assert s["tool_failure_rate"] == pytest.approx(0.5)


def test_pass_at_k_by_level_and_edit_success_from_records():
    """Levels come from the task ids; pass@k is the unbiased estimator per task, averaged; edits
    applied are the edit calls the tool did not refuse."""
    from orchestrator.eval_report import level_rows, task_level

    mut, ret, body = "lib-1:m.py:f:mutation@12", "lib-1:m.py:g:return", "lib-1:m.py:h"
    assert [task_level(t) for t in (mut, ret, body)] == ["mutation", "return", "body"]
    records = ([_rec(mut, i, 1.0 if i < 2 else 0.0, edits=1, edit_failures=0) for i in range(4)]
               + [_rec(ret, i, 0.0, edits=2, edit_failures=2) for i in range(4)]
               + [_rec(body, i, 1.0 if i == 3 else 0.0) for i in range(4)])
    s = summarize(records)
    assert s["by_level"]["mutation"]["pass_at_k"][1] == pytest.approx(0.5)
    assert s["by_level"]["mutation"]["pass_at_k"][2] == pytest.approx(1 - 1 / 6)   # 1 - C(2,2)/C(4,2)
    assert s["by_level"]["body"]["pass_at_k"][4] == 1.0 and s["by_level"]["return"]["tasks_passed_at_n"] == 0
    assert s["edit_success_rate"] == pytest.approx(4 / 12) and s["edit_calls"] == 12
    rows = {r["level"]: r for r in level_rows("p", records)}
    assert rows["return"]["edit_success_rate"] == 0.0 and rows["mutation"]["edit_success_rate"] == 1.0
    assert rows["body"]["edit_success_rate"] is None and rows["body"]["pass@k"] == 1.0


def test_log_drops_unfinished_tail_and_rejects_damage(tmp_path):
    path = tmp_path / RECORDS_FILE
    append_record(path, _rec("a", 0, 1.0))
    append_record(path, _rec("a", 1, 0.0))
    with open(path, "a") as f:
        f.write('{"task": "a", "sample": 2, "rew')  # killed mid-write
    assert [r["sample"] for r in load_records(path)] == [0, 1]
    repair_tail(path)
    append_record(path, _rec("a", 2, 0.5))
    assert [r["sample"] for r in load_records(path)] == [0, 1, 2]
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n{broken\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r":2 is not a JSON record"):
        load_records(path)
    with pytest.raises(ValueError, match="lacks 'reward'"):
        append_record(path, {"task": "x", "sample": 0})


def test_report_is_recomputed_from_records(tmp_path):
    for i, r in enumerate([0.0, 1.0, 0.0]):
        append_record(tmp_path / RECORDS_FILE, _rec("t", i, r))
    (tmp_path / "summary.json").write_text(json.dumps({"best_of_n_pass_rate": 0.0}))  # stale aggregate
    s = write_report(tmp_path)
    assert s["best_of_n_pass_rate"] == 1.0
    assert json.loads((tmp_path / "summary.json").read_text())["best_of_n_pass_rate"] == 1.0
    assert (tmp_path / "report.png").stat().st_size > 1000
    assert "| pass rate | 0.333 | 1.000 |" in (tmp_path / "report.md").read_text()


def test_plan_mismatch_refuses_to_mix_evaluations(tmp_path):
    from orchestrator.evaluator import Evaluator, PlanMismatch
    from rl.config import RunConfig
    ev = Evaluator(RunConfig(), str(tmp_path))
    ev._check_plan({"tasks": ["a"], "k": 3})
    ev._check_plan({"tasks": ["a"], "k": 3})
    with pytest.raises(PlanMismatch, match="different k"):
        ev._check_plan({"tasks": ["a"], "k": 4})


def test_tasks_from_takes_an_earlier_evaluations_tasks_in_its_order(tmp_path):
    from types import SimpleNamespace

    from cli.evaluate import same_tasks_as
    from rl.config import ConfigError
    side = [SimpleNamespace(id=i) for i in ("a", "b", "c", "d")]
    (tmp_path / "plan.json").write_text(json.dumps({"tasks": ["c", "a"], "k": 4}))
    assert [t.id for t in same_tasks_as(str(tmp_path), side)] == ["c", "a"]
    with pytest.raises(ConfigError, match="not on this side"):
        same_tasks_as(str(tmp_path), side[1:])
    with pytest.raises(ConfigError, match="no plan.json"):
        same_tasks_as(str(tmp_path / "nothing"), side)


# --- the real thing: `rlvr eval` killed mid-way, then resumed ------------------------------
def _eval_cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "cli.main", "eval", "--out", str(out),
            "eval.k=2", "eval.max_tasks=2", "task.max_tasks=10", "env.pool_size=1", "env.sandbox_uid_base=64500",
            f"env.work_root={WORK_ROOT}", "scaffold.max_turns=1", "scaffold.wall_clock_s=120",
            "rollout.max_tokens=96", "rollout.max_model_len=4096", "rollout.tool_choice=required",
            "rollout.tool_strict_level=parameter"]


@pytest.mark.heavy
def test_killed_evaluation_resumes_without_loss_or_rerun(tmp_path):
    out = tmp_path / "eval"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    first = subprocess.Popen(_eval_cmd(out), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 500
    records = out / RECORDS_FILE
    while time.monotonic() < deadline and first.poll() is None:
        if records.exists() and len(load_records(records)) >= 1:
            break
        time.sleep(1)
    assert first.poll() is None, first.stdout.read().decode()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)  # the driver and everything it started
    first.wait()
    _unmount_leftovers(WORK_ROOT)
    before = load_records(records)
    assert 1 <= len(before) < 4, "kill must land mid-way"

    second = subprocess.run(_eval_cmd(out), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"{4 - len(before)} episodes to run" in second.stdout + second.stderr
    after = load_records(records)
    raw_keys = [(json.loads(l)["task"], json.loads(l)["sample"]) for l in records.read_text().splitlines()]
    assert Counter(raw_keys).most_common(1)[0][1] == 1, "an episode was recorded twice"
    assert len(after) == 4
    assert after[:len(before)] == before, "finished records must survive untouched"
    assert len({r["attempt"] for r in after}) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["samples_per_task"] == 2
    assert (out / "report.png").exists()


def _unmount_leftovers(root: str) -> None:
    """A SIGKILLed environment actor cannot unmount its checkouts' tmpfs; this test killed it."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(root + "/")), reverse=True):
        subprocess.run(["umount", "-l", m], check=True)  # lazy: a dying actor may still hold it


# --- best-of-N selection (rlvr best-of-n) ------------------------------------------------
def test_best_of_n_scores_by_tests_passing():
    from cli.best_of_n import score_tests
    assert score_tests(0, "=== 12 passed in 0.5s ===") == (1.0, "12 passed")
    score, text = score_tests(1, "=== 3 failed, 9 passed, 1 error in 0.9s ===")
    assert score == pytest.approx(9 / 13) and text == "9 passed, 3 failed, 1 error"
    assert score_tests(1, "=== 10 passed in 0.1s ===")[0] < 1.0  # a failing exit code is never a full pass
    assert score_tests(2, "ImportError: no module") == (0.0, "exit 2")
    assert score_tests(0, "ok") == (1.0, "exit 0")


def test_repo_diff_shows_only_source_changes(tmp_path):
    from cli.best_of_n import repo_diff
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "__pycache__").mkdir(parents=True)
        (d / "m.py").write_text("x = 1\n")
    (b / "m.py").write_text("x = 2\n")
    (b / "__pycache__" / "m.pyc").write_bytes(b"\0")
    diff = repo_diff(a, b)
    assert "-x = 1" in diff and "+x = 2" in diff and "m.pyc" not in diff


def test_run_dir_with_another_model_must_say_what_to_serve(tmp_path, capsys):
    """--run-dir serves the run's adapter on model.path; with model.path overridden that silently
    put the adapter on a model it was not trained on, so the command now refuses the ambiguity."""
    from cli.main import main
    code = main(["eval", "--run-dir", str(tmp_path), "--out", str(tmp_path / "e"), "model.path=/some/other/model"])
    assert code == 2 and "--adapter none" in capsys.readouterr().err


@pytest.mark.heavy
def test_an_interrupted_calibration_records_no_episode_the_interrupt_ended(tmp_path):
    """A batch job's time limit sends SIGINT to the whole job: the episodes still in flight are
    ended by the shutdown and must not be recorded as the policy's failures (they run again on
    resume); the command says so in one line and exits 130."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "cli.main", "calibrate", "--run-dir", str(run), "calibrate.k=2",
           "calibrate.max_tasks=2", "scaffold.max_episode_tokens=4096", *_eval_cmd(run)[8:]]   # the small evaluation's settings
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + 500
    records = run / "calibration" / RECORDS_FILE
    while time.monotonic() < deadline and first.poll() is None:
        if records.exists() and len(load_records(records)) >= 1:
            break
        time.sleep(0.5)
    assert first.poll() is None, first.stdout.read().decode()[-3000:]
    time.sleep(3)   # the next episode is under way
    os.killpg(first.pid, signal.SIGINT)   # as `timeout -s INT` does
    output = first.communicate(timeout=120)[0].decode()
    _unmount_leftovers(WORK_ROOT)
    assert first.returncode == 130 and "rlvr calibrate: interrupted" in output, output[-3000:]
    kept = load_records(records)
    assert 1 <= len(kept) < 4, "the interrupt must land mid-way"
    ended = [r for r in kept if r.get("error") and "exited -" in r["error"]]
    assert not ended, f"episodes ended by the interrupt were recorded: {ended}"
