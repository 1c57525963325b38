"""Durable per-step episode buffer.

Each finished group of episodes is appended (fsync'd) to `episodes/step_NNNNNN.jsonl` as
soon as it completes. A job killed mid-step resumes with the completed groups of that step
instead of regenerating them: they were sampled from the policy of the last checkpoint,
which is exactly the policy the resumed job restores, so they stay on-policy.
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.rollouts.base import Episode
from rl.jsonl import append_durable, read_complete


class EpisodeStore:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "episodes"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, step: int) -> Path:
        return self.dir / f"step_{step:06d}.jsonl"

    def append_group(self, step: int, episodes: list[Episode]) -> None:
        append_durable(self._path(step), [[e.to_json() for e in episodes]])

    def load_groups(self, step: int) -> dict[str, list[Episode]]:
        """Completed groups of a step, keyed by group id (a torn last line is not one)."""
        groups: dict[str, list[Episode]] = {}
        for line in read_complete(self._path(step)):
            episodes = [Episode.from_json(e) for e in line]
            if episodes:
                groups[episodes[0].group_id] = episodes
        return groups

    def drop_after(self, step: int) -> None:
        for path in self.dir.glob("step_*.jsonl"):
            if int(path.stem.split("_")[1]) > step + 1:
                path.unlink()
