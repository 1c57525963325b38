"""Harvest rows: only a finished, passing, short, in-time episode's rows are kept, and a row
whose episode record never landed (killed between the two appends) is dropped."""
from __future__ import annotations

from orchestrator.eval_report import RECORDS_FILE, append_record
from orchestrator.harvest import ROWS_FILE, harvest_rows
from rl.jsonl import append_durable


def _episode(folder, name, reward, turns=3, stop="stop", record=True):
    append_durable(folder / ROWS_FILE, [{"task_id": f"t/{name}", "sample": 0, "episode": name,
                                         "input_ids": [1, 2, 3], "assistant_masks": [0, 1, 1]}])
    if record:
        append_record(folder / RECORDS_FILE, {"task": f"t/{name}", "sample": 0, "episode": name, "reward": reward,
                                              "turns": turns, "stop_reason": stop})


def test_only_kept_episodes_give_rows(tmp_path):
    _episode(tmp_path, "pass", 1.0)
    _episode(tmp_path, "partial", 0.5)
    _episode(tmp_path, "long", 1.0, turns=12)
    _episode(tmp_path, "timeout", 1.0, stop="wall_clock")
    _episode(tmp_path, "killed", 1.0, record=False)
    rows = harvest_rows(tmp_path, max_turns=8)
    assert [r["episode"] for r in rows] == ["pass"]
    assert {r["episode"] for r in harvest_rows(tmp_path, max_turns=20)} == {"pass", "long"}


def test_a_harvest_of_other_tasks_is_refused(tmp_path, monkeypatch):
    """Rows of tasks outside the training split (a harvest of the held-out side, or of another
    run's split) never reach SFT."""
    import pytest

    from orchestrator import warm_start as ws
    from rl.config import load_config

    (tmp_path / "h").mkdir()
    _episode(tmp_path / "h", "task", 1.0)
    cfg = load_config(None, [f"warm_start.harvest_dirs=[{tmp_path / 'h'}]", "warm_start.demos=false"])
    monkeypatch.setattr(ws, "run_sft", lambda *a, **k: pytest.fail("SFT must not start"))
    with pytest.raises(ValueError, match="outside this run's training side"):
        ws.warm_start(cfg, tmp_path / "ws", train_tasks=[], training_side=frozenset({"t/another"}))
    # a rejection-sampling round: rows of the tasks GRPO trains on reach SFT
    monkeypatch.setattr(ws, "run_sft", lambda rows, *a, **k: rows)
    [row] = ws.warm_start(cfg, tmp_path / "ws", train_tasks=[], training_side=frozenset({"t/task"}))
    assert row["task_id"] == "t/task"
