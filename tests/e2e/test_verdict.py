"""pass@k / best-of-k estimators, "training is worth m samples", and the verdict report."""
from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.eval_report import RECORDS_FILE, append_record, load_records
from orchestrator.verdict import compare, matched_verdict, policy_curve, train_rollouts, worth_m, write_verdict
from rl.passk import best_of_k_reward, pass_at_k

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "docs" / "results" / "eval-toolz-base-k3.episodes.jsonl"


def _brute(rewards: list[float], k: int) -> tuple[float, float]:
    """Average over every k-subset: P(some sample passes), E[max reward]."""
    subsets = list(itertools.combinations(rewards, k))
    return (sum(any(r >= 1.0 for r in s) for s in subsets) / len(subsets),
            sum(max(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize("rewards", [[0.0, 1.0, 0.5, 0.0, 1.0], [0.0] * 4, [1.0] * 3, [0.2, 0.9, 0.4, 1.0, 0.0, 0.6]])
def test_estimators_equal_the_average_over_all_subsets(rewards):
    n, c = len(rewards), sum(r >= 1.0 for r in rewards)
    for k in range(1, n + 1):
        p, best = _brute(rewards, k)
        assert pass_at_k(n, c, k) == pytest.approx(p)
        assert best_of_k_reward(rewards, k) == pytest.approx(best)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_estimators_reject_bad_input():
    with pytest.raises(ValueError, match="k=4"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c=5"):
        pass_at_k(3, 5, 1)
    with pytest.raises(ValueError, match="k=0"):
        best_of_k_reward([1.0], 0)


def _recs(task: str, rewards: list[float], stop: str = "stop") -> list[dict]:
    return [{"task": task, "sample": i, "reward": r, "stop_reason": stop, "error": None} for i, r in enumerate(rewards)]


def test_worth_m_and_matched_rollouts():
    start = [0.2, 0.35, 0.45, 0.5]
    assert worth_m(0.40, start) == 3          # start needs 3 samples to reach the trained pass@1
    assert worth_m(0.15, start) == 1          # trained below one start sample
    assert worth_m(0.60, start) is None       # worth more than k samples
    assert worth_m(0.35, start) == 2          # equality counts as reached
    # 20 training episodes over 10 tasks: 3 samples per task at matched count -> pass@3 = 0.45
    v = matched_verdict(0.5, start, train_rollouts=20, tasks=10)
    assert (v["matched_samples"], v["compared_at"], v["training_beats_sampling"]) == (3.0, 3, "yes")
    assert matched_verdict(0.4, start, 20, 10)["training_beats_sampling"] == "no"
    # 100 episodes over 10 tasks: 11 samples, beyond k=4
    assert matched_verdict(0.45, start, 100, 10)["training_beats_sampling"] == "no"   # pass@4 already 0.5
    assert matched_verdict(0.55, start, 100, 10)["training_beats_sampling"] == "undetermined"


def test_compare_on_synthetic_policies():
    base = policy_curve("base", _recs("a", [0, 0, 1, 0]) + _recs("b", [0, 0, 0, 0], stop="max_turns"))
    grpo = policy_curve("grpo", _recs("a", [1, 1, 0, 1]) + _recs("b", [0, 1, 0, 0]))
    # base: task a pass@j = 1 - C(3,j)/C(4,j) = .25, .5, .75, 1; task b 0 -> mean .125 .25 .375 .5
    assert base.pass_at == pytest.approx([0.125, 0.25, 0.375, 0.5])
    assert base.clean_stops == pytest.approx(0.5)
    # grpo pass@1 = (0.75 + 0.25) / 2 = 0.5 -> reaches base's pass@4: worth 4 samples
    v = compare([base, grpo], "base", "grpo", rollouts=8)
    assert v["worth_m"] == 4 and "worth 4 sample(s)" in v["line"]
    # 8 episodes over 2 tasks: 5 samples per task > k; base pass@4 already equals 0.5 -> "no"
    assert v["matched"]["matched_samples"] == 5.0 and v["matched"]["training_beats_sampling"] == "no"
    with pytest.raises(ValueError, match="different tasks"):
        compare([base, policy_curve("x", _recs("a", [0, 1]))], "base", "x")


def test_verdict_on_real_records(tmp_path):
    """The committed base evaluation (3 toolz tasks x 3 pi episodes, nothing passes)."""
    records = load_records(REAL)
    curve = policy_curve("base", records)
    assert curve.k == 3 and len(curve.per_task) == 3
    assert curve.pass_at == [0.0, 0.0, 0.0] and curve.clean_stops == 0.0   # 8 max_turns, 1 length
    # the same records as "start" and "trained": training is worth exactly one sample
    for name in ("base", "trained"):
        (tmp_path / name).mkdir()
        shutil.copy(REAL, tmp_path / name / RECORDS_FILE)
    v = write_verdict([tmp_path / "base", tmp_path / "trained"], ["base", "trained"], tmp_path / "verdict",
                      rollouts=12)
    assert v["worth_m"] == 1 and "does not beat one sample" in v["line"]
    assert v["matched"]["training_beats_sampling"] == "no"
    assert (tmp_path / "verdict" / "verdict.png").stat().st_size > 1000
    assert "| base | 0.000 | 0.000 | 0.000 |" in (tmp_path / "verdict" / "verdict.md").read_text()


def test_eval_report_cli_compares_policies(tmp_path):
    for name, rewards in (("base", [0.0, 1.0, 0.0]), ("grpo", [1.0, 1.0, 0.0])):
        (tmp_path / name).mkdir()
        for r in _recs("t1", rewards) + _recs("t2", [0.0, 0.0, 0.5]):
            append_record(tmp_path / name / RECORDS_FILE, r)
    run = tmp_path / "run" / "episodes"
    run.mkdir(parents=True)
    (run / "step_000001.jsonl").write_text(json.dumps([{}] * 4) + "\n" + json.dumps([{}] * 4) + "\n")
    assert train_rollouts(tmp_path / "run") == 8
    out = subprocess.run([sys.executable, "-m", "cli.main", "eval-report", str(tmp_path / "base"),
                          str(tmp_path / "grpo"), "--train-run", str(tmp_path / "run"), "--out",
                          str(tmp_path / "v")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    v = json.loads((tmp_path / "v" / "verdict.json").read_text())
    assert v["policies"]["grpo"]["pass_at"][0] == pytest.approx(1 / 3)
    assert v["worth_m"] == 2 and v["matched"]["matched_samples"] == 5.0
    bad = subprocess.run([sys.executable, "-m", "cli.main", "eval-report", str(tmp_path / "base"),
                          str(tmp_path / "grpo"), "--names", "one"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "1 name(s) for 2" in bad.stderr
