"""Multi-turn coding rollouts: G episodes per task through a scaffold, against the policy
server, with tools and reward on EnvActors. Produces scored episodes whose samples are the
policy server's recorded token ids and log-probs, assembled into training sequences."""
from __future__ import annotations

import itertools
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray

from rl.assembly import assemble
from rl.config import RunConfig
from rl.episode_store import Episode
from rl.length_rollouts import step_group_specs

SERVED_MODEL = "policy"


def url_safe(name: str) -> str:
    """Episode ids travel in the policy server's URL path: task ids hold '/' and ':'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class AgenticRollouts:
    def __init__(self, cfg: RunConfig, run_dir: Path, workers: list, placement):
        from actors.env_actor import EnvActor
        from envs.split import write_split
        from envs.tasks import load_tasks, resolve_tasks_file

        self.cfg = cfg
        self.workers = workers
        self.trace_path = Path(run_dir) / "trace.jsonl"
        tasks_file = resolve_tasks_file(cfg.task.tasks_file, cfg.task.library)
        tasks = load_tasks(tasks_file)
        if cfg.task.max_tasks:
            tasks = tasks[:cfg.task.max_tasks]
        split = write_split(run_dir, tasks, cfg.task.train_fraction, cfg.trainer.seed)
        by_id = {t.id: t for t in tasks}
        self.train_tasks = [by_id[i] for i in split.train]
        if not self.train_tasks:
            raise ValueError(f"no training tasks in {tasks_file} after the split; raise task.max_tasks "
                             f"or task.train_fraction")
        self.env_actors = [ray.remote(EnvActor).options(**placement.options("env", i, cfg),
                                                        max_concurrency=cfg.env.pool_size + 1)
                           .remote(cfg.env) for i in range(cfg.env.num_env_actors)]
        self.server_urls = ray.get([w.start_server.remote() for w in workers])
        self._trace_lock = threading.Lock()
        self._counter = itertools.count()
        print(f"[rlvr] {len(self.train_tasks)} training tasks; policy servers {self.server_urls}", flush=True)

    def group_specs(self, step: int) -> list[tuple[str, int]]:
        return step_group_specs(step, self.cfg.trainer.batch_size, self.cfg.trainer.seed,
                                [t.id for t in self.train_tasks])

    def run_groups(self, specs: list[tuple[str, int]], step: int, on_group_done) -> None:
        g = self.cfg.trainer.group_size
        parallel = self.cfg.env.num_env_actors * self.cfg.env.pool_size
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            futures = {gid: [pool.submit(self._episode, gid, url_safe(f"{gid}-e{k}"), self.train_tasks[idx])
                             for k in range(g)] for gid, idx in specs}
            for gid, group in futures.items():
                episodes = [f.result() for f in group]
                self._trace(step, episodes)
                on_group_done(episodes)

    def _episode(self, group_id: str, episode_id: str, task) -> Episode:
        n = next(self._counter)
        worker = self.workers[n % len(self.workers)]
        env = self.env_actors[n % len(self.env_actors)]
        url = f"{self.server_urls[n % len(self.workers)]}/episodes/{episode_id}/v1"
        env_episode = ray.get(env.open_episode.remote(task))
        try:
            outcome = self._run_scaffold(url, env, env_episode, task)
        finally:
            reward = ray.get(env.finish.remote(env_episode))
        calls = ray.get(worker.take_episode_calls.remote(episode_id))
        asm = assemble(calls)
        completion_tokens = sum(len(c.completion_token_ids) for c in calls)
        record = {"task": task.id, "episode": episode_id, "reward": reward.reward, "reward_parts": reward.parts,
                  "edited": reward.edited, "tests_passed": reward.tests_passed, "tests_total": reward.tests_total,
                  "turns": outcome.turns, "tool_calls": outcome.tool_calls, "tool_failures": outcome.tool_failures,
                  "stop_reason": outcome.stop_reason, "error": outcome.error or reward.error,
                  "clipped": any(c.finish_reason == "length" for c in calls), "tokens": completion_tokens,
                  "calls": len(calls), "merged_calls": asm.merged_calls, "split_calls": asm.split_calls,
                  "seconds": outcome.seconds, "reward_seconds": reward.seconds}
        return Episode(group_id=group_id, reward=reward.reward, samples=asm.samples, record=record)

    def _run_scaffold(self, url: str, env, env_episode: str, task):
        cfg = self.cfg.scaffold
        if cfg.name == "pi":
            from scaffolds.pi_agent import run_pi_episode_on_actor
            return run_pi_episode_on_actor(env, env_episode, task.problem_statement, url, SERVED_MODEL, cfg,
                                           context_window=self.cfg.rollout.max_model_len,
                                           max_tokens=self.cfg.rollout.max_tokens)
        from scaffolds.native import run_native_episode
        cwd = ray.get(env.sandbox_cwd.remote(env_episode))
        return run_native_episode(url, SERVED_MODEL, env, env_episode, task.problem_statement, cwd, cfg)

    def _trace(self, step: int, episodes: list[Episode]) -> None:
        with self._trace_lock, open(self.trace_path, "a") as f:
            for e in episodes:
                f.write(json.dumps({"step": step, "group": e.group_id, **e.record}) + "\n")
            f.flush()
            os.fsync(f.fileno())
