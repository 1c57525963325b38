"""The Rollouts interface the training loop drives, and the stateless data cursor.

A step asks its rollout source for the step's group specs (which prompts/tasks, by a cursor
that depends only on the step), then has it roll out the groups not yet stored; every
finished group is handed back as a list of typed `Episode`s.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from rl.types import EpisodeRecord, TokenSequence


@dataclass(frozen=True)
class GroupSpec:
    """One group of a step: its id (stable across a resume) and the prompt/task index; a rescued
    group's episodes start from that many calls of a demonstration (orchestrator/rescue.py)."""
    group_id: str
    index: int
    prefix_calls: int = 0


@dataclass
class Episode:
    """One rollout as the trainer groups it: an EpisodeRun (record + token sequences) tagged with
    its GRPO group and reward, before advantages are assigned."""
    group_id: str
    reward: float
    sequences: list[TokenSequence]
    record: EpisodeRecord

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Episode":
        return cls(group_id=data["group_id"], reward=data["reward"],
                   sequences=[TokenSequence(**s) for s in data["sequences"]],
                   record=EpisodeRecord(**data["record"]))


class Rollouts(Protocol):
    names: list[str]  # the prompts/tasks a GroupSpec.index points into

    def group_specs(self, step: int) -> list[GroupSpec]:
        """The step's groups, a pure function of the step (a resumed run draws the same)."""

    def run_groups(self, specs: list[GroupSpec], step: int, on_group_done: Callable[[list[Episode]], None],
                   on_episode_done: Callable[[Episode], None] | None = None) -> None:
        """Roll the groups out; call on_group_done with each finished group's episodes, and
        on_episode_done (from any thread) with each episode as it finishes (progress)."""

    def rescue_calls(self, index: int) -> int:
        """Demonstration calls a rescue of task `index` may start from (0: it cannot be rescued)."""


def epoch_order(n_items: int, seed: int, index: int) -> int:
    """The item at position `index` of a reshuffled-every-epoch stream (stateless cursor)."""
    epoch, offset = divmod(index, n_items)
    order = list(range(n_items))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[offset]


def step_group_specs(step: int, batch_size: int, seed: int, names: list[str]) -> list[GroupSpec]:
    """The groups of a step: the data cursor is (step - 1) * batch_size, so a resumed run
    draws exactly the groups the killed one would have."""
    specs = []
    for j in range((step - 1) * batch_size, step * batch_size):
        idx = epoch_order(len(names), seed, j)
        specs.append(GroupSpec(f"s{step}-g{j}-{names[idx]}", idx))
    return specs
