"""Durable per-step episode buffer, and the index of every group a run sampled.

Each finished group of episodes is appended (fsync'd) to `episodes/step_NNNNNN.jsonl` as
soon as it completes. A job killed mid-step resumes with the completed groups of that step
instead of regenerating them: they were sampled from the policy of the last checkpoint,
which is exactly the policy the resumed job restores, so they stay on-policy.

Beside them, `episodes/groups.jsonl` holds one small line per finished group (step, task,
demonstration prefix, rewards): what later steps read about earlier ones (the rescue
schedule) without the token data, which a moved run (orchestrator/run_pack.py) leaves behind
for steps its checkpoint covers.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.rollouts.base import Episode
from rl.jsonl import append_durable, read_complete

INDEX = "groups.jsonl"


@dataclass(frozen=True)
class GroupSummary:
    step: int
    group_id: str
    task: str
    prefix_calls: int
    rewards: tuple[float, ...]

    @property
    def pass_rate(self) -> float:
        return sum(r >= 1.0 for r in self.rewards) / len(self.rewards)


def _summary(step: int, episodes: list[Episode]) -> GroupSummary:
    first = episodes[0].record
    return GroupSummary(step, episodes[0].group_id, first.task, first.prefix_calls or 0,
                        tuple(e.reward for e in episodes))


class EpisodeStore:
    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "episodes"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = self.dir / INDEX

    def _path(self, step: int) -> Path:
        return self.dir / f"step_{step:06d}.jsonl"

    def append_group(self, step: int, episodes: list[Episode]) -> None:
        # the index line first: a kill between the two leaves a group that is rolled out again,
        # whose new line then replaces this one (readers keep the last line of a group)
        append_durable(self.index, [asdict(_summary(step, episodes))])
        append_durable(self._path(step), [[e.to_json() for e in episodes]])

    def load_groups(self, step: int) -> dict[str, list[Episode]]:
        """Completed groups of a step, keyed by group id (a torn last line is not one)."""
        groups: dict[str, list[Episode]] = {}
        for line in read_complete(self._path(step)):
            episodes = [Episode.from_json(e) for e in line]
            if episodes:
                groups[episodes[0].group_id] = episodes
        return groups

    def summaries_before(self, step: int) -> list[GroupSummary]:
        """Every group of the steps before `step`, in the order they finished. A run recorded
        before the index existed is indexed once from its step files."""
        if not self.index.exists():
            for path in sorted(self.dir.glob("step_*.jsonl")):
                s = int(path.stem.split("_")[1])
                rows = [asdict(_summary(s, g)) for g in self.load_groups(s).values()]
                if rows:
                    append_durable(self.index, rows)
        last = {(r["step"], r["group_id"]): r for r in read_complete(self.index) if r["step"] < step}
        return [GroupSummary(r["step"], r["group_id"], r["task"], r["prefix_calls"], tuple(r["rewards"]))
                for r in last.values()]

    def drop_after(self, step: int) -> None:
        """Forget what a killed run sampled past the step it resumes at (step + 1 stays: reused)."""
        for path in self.dir.glob("step_*.jsonl"):
            if int(path.stem.split("_")[1]) > step + 1:
                path.unlink()
        kept = [r for r in read_complete(self.index) if r["step"] <= step + 1]
        if self.index.exists() and len(kept) != len(read_complete(self.index)):
            tmp = self.index.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)
            append_durable(tmp, kept)
            tmp.replace(self.index)
