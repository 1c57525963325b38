"""Helpers for the environment tests: a small EnvConfig, the shipped (or freshly mined)
toolz tasks, and an episode built on a real mined task."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from rl.config import EnvConfig

REPO = Path(__file__).resolve().parent.parent
SHIPPED_TOOLZ = REPO / "configs" / "tasks" / "toolz.jsonl"
WORK_ROOT = os.environ.get("RLVR_TEST_WORK_ROOT", "/tmp/agentic-rlvr-test")


def env_cfg(**overrides) -> EnvConfig:
    base = dict(pool_size=2, command_timeout_s=10.0, verify_timeout_s=60.0, memory_mib=1024,
                max_processes=64, max_file_mib=16, disk_mib=128, test_timeout_s=5.0,
                work_root=WORK_ROOT, sandbox_uid_base=63000)
    base.update(overrides)
    return EnvConfig(**base)


def toolz_tasks():
    """The shipped toolz task file; mined (a few functions) if it is not there yet."""
    from envs.tasks import load_tasks
    if SHIPPED_TOOLZ.exists():
        return load_tasks(SHIPPED_TOOLZ)
    from envs.mining import mine
    tasks, _ = mine("toolz", limit=12, work_root=WORK_ROOT, workers=1)
    return tasks


def task_by_qualname(tasks, qualname: str):
    for t in tasks:
        if t.qualname == qualname:
            return t
    raise LookupError(f"no task for {qualname}; have {[t.qualname for t in tasks][:20]}")


@contextlib.contextmanager
def episode(task, **cfg_overrides):
    from envs.coding_env import CodingEnv
    env = CodingEnv(task, WORK_ROOT, env_cfg(**cfg_overrides))
    try:
        yield env
    finally:
        env.close()


def replace_body(env, new_body: str) -> None:
    """Put `new_body` where the stub is, as an agent's edit would (through pi's edit tool)."""
    res = env.call_tool("edit", {"path": env.task.module_path,
                                 "edits": [{"oldText": env.task.stub_body, "newText": new_body}]})
    assert not res.is_error, res.content
