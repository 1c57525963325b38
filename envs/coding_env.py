"""One coding episode: a stubbed checkout of a real repository in its own size-limited
mount, pi's tools against it (commands sandboxed), and the execution reward.

    env = CodingEnv(task, work_root, env_cfg)        # builds the checkout
    env.tools()                                      # pi's schemas for read/bash/edit/write
    env.call_tool("bash", '{"command": "ls"}')       # -> ToolResult; never raises for bad input
    env.reward()                                     # -> RewardResult (verifies on a pristine copy)
    env.close()                                      # kills leftovers, unmounts, deletes

The agent sees the checkout at /repo (`INSIDE_REPO`); `env.checkout` is the host path.
`env.sandbox` is the episode's `Sandbox` (use `.popen(...)` to run the pi agent inside it).
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from envs.gate import prefetch_original
from envs.reward import RewardResult, compute_reward
from envs.sandbox import INSIDE_REPO, Limits, QuotaDir, Sandbox, chown_tree, kill_uid
from envs.sdist import tree_for
from envs.tasks import Task
from envs.testdeps import overlay_for
from envs.tools import PI_TOOLS, ToolResult, Tools

__all__ = ["CodingEnv", "PI_TOOLS", "ToolResult", "RewardResult", "INSIDE_REPO", "limits_from"]


def limits_from(env_cfg) -> Limits:
    return Limits(cpu_s=int(max(env_cfg.command_timeout_s, env_cfg.verify_timeout_s)) + 5,
                  memory_mib=env_cfg.memory_mib, max_processes=env_cfg.max_processes,
                  max_file_mib=env_cfg.max_file_mib, nice=env_cfg.nice)


def pristine_for(task: Task) -> Path:
    return tree_for(task.library, task.version, task.sdist_filename, task.sdist_sha256, task.sdist_url)


class CodingEnv:
    def __init__(self, task: Task | dict, work_root: str | Path, env_cfg, uid: int | None = None) -> None:
        self.task = task if isinstance(task, Task) else Task.from_json(task)
        self.cfg = env_cfg
        self.uid = env_cfg.sandbox_uid_base if uid is None else uid
        self.pristine = pristine_for(self.task)
        overlay = overlay_for(self.task.test_deps)
        self.site_overlay = overlay.path if overlay else None
        root = Path(work_root)
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        self.dir = root / f"env-{uuid.uuid4().hex[:10]}"
        self._quota = QuotaDir(self.dir, env_cfg.disk_mib)
        self._closed = False
        try:
            self.checkout = self.dir / "repo"
            tmp = self.dir / "tmp"
            # no __pycache__: the target module's .pyc holds the reference body
            shutil.copytree(self.pristine, self.checkout, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
            module = self.checkout / self.task.module_path
            module.write_text(self.task.stubbed_source((self.pristine / self.task.module_path).read_text()))
            tmp.mkdir(mode=0o700)
            chown_tree(self.checkout, self.uid)
            os.lchown(tmp, self.uid, self.uid)
            self.limits = limits_from(env_cfg)
            self.sandbox = Sandbox(self.checkout, uid=self.uid, limits=self.limits, tmp_dir=tmp,
                                   max_output_chars=env_cfg.max_output_chars, site_overlay=self.site_overlay)
            self._tools = Tools(self.checkout, self.sandbox, self.uid, env_cfg.command_timeout_s,
                                env_cfg.max_output_chars, env_cfg.max_file_mib * 1024 * 1024)
            # the reward's differential gate needs the original's results, which the agent cannot
            # change: they are computed while the episode runs (once per host process and task)
            prefetch_original(self.task, self.pristine, root, self.uid, self.limits, env_cfg.verify_timeout_s,
                              self.site_overlay)
        except BaseException:
            self._quota.close()
            raise

    @property
    def inside_checkout(self) -> str:
        return INSIDE_REPO

    def tools(self) -> list[dict]:
        """pi's exact tool schemas (OpenAI function format) for read, bash, edit, write."""
        return [dict(t) for t in PI_TOOLS]

    def call_tool(self, name: str, arguments: str | dict | None) -> ToolResult:
        if self._closed:
            return ToolResult("The episode is closed.", True)
        return self._tools.call(name, arguments)

    def reward(self) -> RewardResult:
        kill_uid(self.uid)   # nothing the agent started may run during verification
        scratch = self.dir.parent
        return compute_reward(self.task, self.checkout, self.pristine, scratch, self.uid,
                              self.limits, self.cfg.verify_timeout_s, self.cfg.test_timeout_s,
                              site_overlay=self.site_overlay)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        kill_uid(self.uid)
        self._quota.close()

    def __enter__(self) -> "CodingEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
