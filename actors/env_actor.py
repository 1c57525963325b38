"""EnvActor: a pool of sandboxed coding environments on one Ray actor (CPU only).

Plain class, made a Ray actor by orchestrator.cluster.spawn_env_actors. Every episode gets a pool slot, and each slot its
own sandbox uid (so rlimits such as the process count are per episode, and leftovers of a
finished episode can be killed by uid before the slot is reused). Actors on one host claim
disjoint uid blocks through flock'ed files under env.work_root (released when the process dies). Every method catches what
one episode's environment raises and turns it into an error result for that episode only.

    eid = actor.open_episode(task)                 # Task or its dict; PoolFull if all slots are open
    actor.call_tool(eid, "read", {"path": "x.py"}) # -> ToolResult
    actor.checkout_path(eid)                       # host path of the checkout
    actor.sandbox_cwd(eid)                         # "/repo": the checkout as the agent sees it
    actor.finish(eid)                              # -> RewardResult, frees the slot
    actor.close_episode(eid)                       # free without a reward (idempotent)
    actor.run_in_episode(eid, fn, *args)           # fn(CodingEnv, *args) on the actor (pi scaffold)
"""
from __future__ import annotations

import fcntl
import shutil
import subprocess
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

from envs.coding_env import CodingEnv
from envs.reward import RewardResult
from envs.sandbox import kill_uid
from envs.tasks import Task
from envs.tools import ToolResult


class PoolFull(RuntimeError):
    """All pool slots hold open episodes; finish or close one first."""


class EnvActor:
    def __init__(self, env_cfg, node_check: Callable[[], None] | None = None) -> None:
        """node_check: run first, on this actor's node; its error fails the actor at start."""
        if node_check is not None:
            node_check()
        self.cfg = env_cfg
        self.pool_size = env_cfg.pool_size
        block, self._block_lock = _claim_uid_block(Path(env_cfg.work_root))
        self.uid_base = env_cfg.sandbox_uid_base + block * env_cfg.pool_size
        _sweep_dead_holder(Path(env_cfg.work_root), block, range(self.uid_base, self.uid_base + self.pool_size))
        self.work_root = Path(env_cfg.work_root) / f"actor-{block}-{uuid.uuid4().hex[:6]}"
        self._lock = threading.Lock()
        self._free = list(range(self.pool_size))
        self._episodes: dict[str, tuple[int, CodingEnv]] = {}

    def open_episode(self, task: Task | dict) -> str:
        with self._lock:
            if not self._free:
                raise PoolFull(f"all {self.pool_size} environments are in use (env.pool_size); "
                               "finish or close an episode first")
            slot = self._free.pop(0)
        try:
            env = CodingEnv(task, self.work_root, self.cfg, uid=self.uid_base + slot)
        except BaseException:
            with self._lock:
                self._free.append(slot)
            raise
        eid = f"ep-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._episodes[eid] = (slot, env)
        return eid

    def _env(self, eid: str) -> CodingEnv:
        entry = self._episodes.get(eid)
        if entry is None:
            raise KeyError(f"unknown or closed episode {eid!r}")
        return entry[1]

    def call_tool(self, eid: str, name: str, arguments: Any) -> ToolResult:
        try:
            env = self._env(eid)
        except KeyError as e:
            return ToolResult(str(e), True)
        try:
            return env.call_tool(name, arguments)
        except Exception as e:  # an environment fault is this episode's failed tool call, not the actor's
            return ToolResult(f"internal error running {name!r}: {type(e).__name__}: {e}", True)

    def checkout_path(self, eid: str) -> str:
        return str(self._env(eid).checkout)

    def sandbox_cwd(self, eid: str) -> str:
        return self._env(eid).inside_checkout

    def run_in_episode(self, eid: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
        return fn(self._env(eid), *args, **kwargs)

    def finish(self, eid: str) -> RewardResult:
        """Reward the episode, then free its environment for reuse."""
        try:
            env = self._env(eid)
        except KeyError as e:
            return RewardResult(0.0, {}, error=str(e))
        try:
            result = env.reward()
        except Exception as e:
            result = RewardResult(0.0, {"traceback": traceback.format_exc()[-2000:]},
                                  error=f"verification crashed: {type(e).__name__}: {e}")
        finally:
            self.close_episode(eid)
        return result

    def close_episode(self, eid: str) -> None:
        with self._lock:
            entry = self._episodes.pop(eid, None)
        if entry is None:
            return
        slot, env = entry
        try:
            env.close()
        finally:
            with self._lock:
                self._free.append(slot)

    def open_count(self) -> int:
        return len(self._episodes)

    def shutdown(self) -> None:
        for eid in list(self._episodes):
            self.close_episode(eid)
        if self.work_root.is_dir() and not any(self.work_root.iterdir()):
            self.work_root.rmdir()


def _claim_uid_block(work_root: Path, max_blocks: int = 64) -> tuple[int, Any]:
    locks = work_root / ".uid-blocks"
    locks.mkdir(parents=True, exist_ok=True)
    for block in range(max_blocks):
        f = open(locks / f"{block}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        return block, f
    raise RuntimeError(f"more than {max_blocks} EnvActors on this host hold uid blocks under {locks}")


def _sweep_dead_holder(work_root: Path, block: int, uids: range) -> None:
    """A killed actor leaves its episodes' processes and checkout quota mounts behind; the
    next holder of its uid block (the lock proves the old holder is dead) clears them."""
    for uid in uids:
        kill_uid(uid)
    stale_dirs = [str(d) for d in work_root.glob(f"actor-{block}-*")]
    if not stale_dirs:
        return
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(tuple(d + "/" for d in stale_dirs))), reverse=True):
        subprocess.run(["umount", mount], check=True)
    for d in stale_dirs:
        shutil.rmtree(d)
