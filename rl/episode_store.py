"""Durable per-step episode buffer.

Each finished group of episodes is appended (fsync'd) to `episodes/step_NNNNNN.jsonl` as
soon as it completes. A job killed mid-step resumes with the completed groups of that step
instead of regenerating them: they were sampled from the policy of the last checkpoint,
which is exactly the policy the resumed job restores, so they stay on-policy.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Episode:
    """One rollout: its samples (without advantage yet), reward and trace record."""
    group_id: str
    reward: float
    samples: list[dict]            # {"token_ids", "loss_mask", "logprobs"}
    record: dict = field(default_factory=dict)


class EpisodeStore:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "episodes"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, step: int) -> Path:
        return self.dir / f"step_{step:06d}.jsonl"

    def append_group(self, step: int, episodes: list[Episode]) -> None:
        line = json.dumps([asdict(e) for e in episodes])
        with open(self._path(step), "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def load_groups(self, step: int) -> dict[str, list[Episode]]:
        """Completed groups of a step, keyed by group id; a torn last line is ignored."""
        path = self._path(step)
        groups: dict[str, list[Episode]] = {}
        if not path.exists():
            return groups
        for line in path.read_text().splitlines():
            try:
                episodes = [Episode(**e) for e in json.loads(line)]
            except json.JSONDecodeError:
                continue
            if episodes:
                groups[episodes[0].group_id] = episodes
        return groups

    def drop_after(self, step: int) -> None:
        for path in self.dir.glob("step_*.jsonl"):
            if int(path.stem.split("_")[1]) > step + 1:
                path.unlink()
