"""Prefix rescue for groups where every episode fails (BREAD, arXiv 2506.17211; a reverse
curriculum).

A group whose every reward is 0 carries no gradient, and dynamic sampling only moves on to
other tasks, so a task the policy never solves is never learned. A rescued group runs the
same task again with its first k calls taken from a verified demonstration of that task:
the policy server answers those calls with the demonstration's assistant messages (scripted
turns), the scaffold runs their tool calls for real, and the learner never trains their
tokens (loss mask 0; the episode's record names the prefix). The policy only has to finish
what the demonstration started.

k starts at the demonstration's calls before its fixing edit (the fix is always left to the
policy: a prefix holding it would pass every episode and tie again) and shrinks by one each
time a rescued group of that task passes at `shrink_at` or more, until the task is met with
no help. The schedule is read back from the episode store's group index, so a resumed run
rescues as the killed one would have.

The demonstrations are built like the warm-start's (scaffolds/demos.py, the direct variant)
for training tasks only, once per task, cached in `<run_dir>/rescue/demos.jsonl`.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

from envs.tasks import Task
from rl.config import RunConfig
from rl.jsonl import append_durable, read_complete
from rl.types import Prefix

RESCUE_UID_OFFSET = 700   # above the episode slots and the warm-start's demonstrations (+500)
DEMOS_FILE = "demos.jsonl"


def prefix_calls_now(max_calls: int, rescued_pass_rates: list[float], shrink_at: float) -> int:
    """The prefix length for a task's next rescue: max_calls, one less for every earlier
    rescued group of that task that passed at shrink_at or more (0: no more help)."""
    return max(0, max_calls - sum(p >= shrink_at for p in rescued_pass_rates))


def fixing_call(messages: list[dict]) -> int:
    """How many assistant turns of a demonstration come before its first `edit` call."""
    turns = [m for m in messages if m.get("role") == "assistant"]
    for i, m in enumerate(turns):
        if any(tc["function"]["name"] == "edit" for tc in m.get("tool_calls") or []):
            return i
    return 0


class RescueDemos:
    """One verified demonstration per training task, built on first need and cached."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.path = Path(run_dir) / "rescue" / DEMOS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._demos: dict[str, dict] = {d["task_id"]: d for d in read_complete(self.path)}

    def _demo(self, task: Task) -> dict:
        with self._lock:
            if task.id not in self._demos:
                from scaffolds.demos import build_demonstration  # a sandbox run: only when a group needs it
                demo = build_demonstration(task, self.cfg.env, uid=self.cfg.env.sandbox_uid_base + RESCUE_UID_OFFSET,
                                           seed=0, recovery=False)
                row = ({"task_id": task.id, "variant": demo.variant, "seed": demo.seed, "messages": demo.messages}
                       if demo is not None and demo.reward >= 1.0 else {"task_id": task.id, "messages": []})
                append_durable(self.path, [row])
                self._demos[task.id] = row
                print(f"[rlvr] rescue: {'a verified demonstration' if row['messages'] else 'no demonstration'} "
                      f"of {task.id}", flush=True)
            return self._demos[task.id]

    def max_calls(self, task: Task) -> int:
        """Prefix calls a rescue of this task may start from (0: none can be built)."""
        return fixing_call(self._demo(task)["messages"])

    def prefix(self, task: Task, calls: int) -> Prefix:
        demo = self._demo(task)
        turns = [m for m in demo["messages"] if m.get("role") == "assistant"][:calls]
        if len(turns) < calls:
            raise ValueError(f"rescue of {task.id}: the demonstration has {len(turns)} turns, {calls} asked")
        return Prefix(messages=json.loads(json.dumps(turns)),
                      source=f"{task.id} demonstration ({demo.get('variant')}, seed {demo.get('seed')})")
