"""Checkpoints: learner state (LoRA, optimizer, RNG) + trainer state (step, Python RNG),
published atomically so a job killed at any moment resumes from the last complete one."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

KEEP_LAST = 2
SCRATCH = ("adapters", "merged_weights", "warm_start")  # in a run directory: rebuilt or re-sent; large


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, learner, trainer_state: dict) -> Path:
    root = checkpoints_dir(run_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    learner.save_state(str(tmp / "learner"))
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(root.glob("step_*"))[:-KEEP_LAST]:
        shutil.rmtree(old)
    return final


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    done = sorted(p for p in checkpoints_dir(run_dir).glob("step_*") if (p / "trainer_state.json").is_file())
    if not done:
        return None
    state = json.loads((done[-1] / "trainer_state.json").read_text())
    return int(state["step"]), done[-1]


def load_trainer_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "trainer_state.json").read_text())
