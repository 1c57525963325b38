import json

import pytest
import yaml

from orchestrator.run_compare import compare_runs, render


def _run(path, lr, band, entropy):
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"learner": {"lr": lr}, "trainer": {"group_size": 8}}))
    rows = [{"step": i + 1, "band/reward_mean": b, "policy/entropy": e, "sampling/groups_sampled": 8,
             "time_step_s": 32.0, "frac_reward_zero_std": 0.25} for i, (b, e) in enumerate(zip(band, entropy))]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_arms_are_compared_over_their_shared_steps_and_paired_per_step(tmp_path):
    a = _run(tmp_path / "lr-1e-05", 1e-5, [0.4, 0.5, 0.4, 0.5, 0.4, 0.5], [0.9] * 6)
    b = _run(tmp_path / "lr-2e-04", 2e-4, [0.4, 0.6, 0.5, 0.7, 0.6], [0.9, 0.8, 0.8, 0.7, 0.7])
    result = compare_runs([a, b], n=2)
    assert result["steps"] == [1, 2, 3, 4, 5]            # the sixth step only one arm has is left out
    base, arm = result["runs"]
    assert arm["paired_diff"] == pytest.approx((0 + 0.1 + 0.1 + 0.2 + 0.2) / 5)
    assert arm["last_minus_first"] == pytest.approx(0.65 - 0.5)
    assert arm["episodes_per_s"] == pytest.approx(64 / 32)
    assert (arm["entropy_first"], arm["entropy_last"]) == (0.9, 0.7)
    table = render(result)
    assert "lr-2e-04" in table and "+0.120+-" in table


def test_runs_without_a_shared_step_are_refused(tmp_path):
    a = _run(tmp_path / "a", 1e-5, [0.5], [1.0])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.yaml").write_text(yaml.safe_dump({"learner": {"lr": 1e-4}, "trainer": {"group_size": 8}}))
    (tmp_path / "b" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="share no logged step"):
        compare_runs([a, tmp_path / "b"])
