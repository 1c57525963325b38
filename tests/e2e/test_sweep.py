"""rlvr sweep end to end on the CPU engine: two arms of the length job side by side on one Ray,
compared, then continued by the same command."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _sweep(out: Path, steps: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "sweep", "configs/length.yaml", "--key", "learner.lr",
                           "--values", "1e-3", "4e-3", "--out", str(out), "--poll-s", "5", f"trainer.steps={steps}",
                           "trainer.batch_size=2", "trainer.group_size=4"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.heavy
def test_two_arms_run_side_by_side_are_compared_and_continue(tmp_path):
    out = tmp_path / "sweep"
    first = _sweep(out, 1)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for arm in ("lr-1e-3", "lr-4e-3"):
        steps = [json.loads(line)["step"] for line in (out / arm / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1], (arm, steps)
    assert "lr-4e-3" in first.stdout and "band" in first.stdout.lower()   # rlvr compare's table
    again = _sweep(out, 2)   # the same command continues both arms
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for arm, lr in (("lr-1e-3", 1e-3), ("lr-4e-3", 4e-3)):
        steps = [json.loads(line)["step"] for line in (out / arm / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2], (arm, steps)
        assert load_config(out / arm / "config.yaml").learner.lr == lr
