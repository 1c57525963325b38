"""Multi-turn coding rollouts: G episodes per task through the episode runner (a scaffold
against the policy server, tools and reward on EnvActors). Each episode's samples are the
policy server's recorded token ids and log-probs, assembled into training sequences."""
from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

import ray

from envs.split import select_tasks
from orchestrator.cluster import Placement, alive_nodes, spawn_env_actors
from orchestrator.env_slots import EnvSlots
from orchestrator.rescue import RescueDemos
from orchestrator.rollouts.base import Episode, GroupSpec, step_group_specs
from rl.config import RunConfig
from rl.jsonl import append_durable
from scaffolds.episode import EpisodeSettings, run_episode, safe_id


class AgenticRollouts:
    def __init__(self, cfg: RunConfig, run_dir: Path, workers: list, placement: Placement | None):
        self.cfg = cfg
        self.workers = workers
        self.trace_path = Path(run_dir) / "trace.jsonl"
        spans = placement.spans_nodes() if placement is not None else alive_nodes() > 1
        servers = [w.start_server.remote(spans) for w in workers]  # each starts once its engine is up,
        # beside the env actors' start
        self.train_tasks = select_tasks(cfg.task, cfg.trainer.seed, run_dir, "train")
        self.names = [t.id for t in self.train_tasks]
        self.settings = EpisodeSettings.for_training(cfg)
        self.env_actors = spawn_env_actors(cfg, placement, self.train_tasks)
        self.env_slots = EnvSlots(self.env_actors, cfg.env.pool_size)
        self.rescue = RescueDemos(cfg, run_dir) if cfg.trainer.rescue.enabled else None
        self.server_urls = ray.get(servers)
        self._counter = itertools.count()
        self._counter_lock = threading.Lock()
        print(f"[rlvr] {len(self.train_tasks)} training tasks; policy servers {self.server_urls}", flush=True)

    def group_specs(self, step: int) -> list[GroupSpec]:
        return step_group_specs(step, self.cfg.trainer.batch_size, self.cfg.trainer.seed, self.names)

    def run_groups(self, specs: list[GroupSpec], step: int, on_group_done, on_episode_done=None) -> None:
        """Roll out every episode of every group at once, as many in flight as there are env
        slots (env.num_env_actors x env.pool_size); each group is handed to on_group_done
        (and the trace) as soon as its last episode ends, in finishing order. Callable again
        mid-step for replacement groups. on_episode_done sees each episode as it ends."""
        g = self.cfg.trainer.group_size
        parallel = self.cfg.env.num_env_actors * self.cfg.env.pool_size
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            group_of = {}
            for s in specs:
                for k in range(g):
                    f = pool.submit(self._episode, s.group_id, safe_id(f"{s.group_id}-e{k}"), self.train_tasks[s.index],
                                    on_episode_done, s.prefix_calls)
                    group_of[f] = (s.group_id, k)
            finished: dict[str, dict[int, Episode]] = {s.group_id: {} for s in specs}
            for f in as_completed(group_of):
                gid, k = group_of[f]
                finished[gid][k] = f.result()
                if len(finished[gid]) == g:
                    episodes = [finished[gid][i] for i in range(g)]
                    append_durable(self.trace_path, [{"step": step, "group": gid, **asdict(e.record)} for e in episodes])
                    on_group_done(episodes)

    def rescue_calls(self, index: int) -> int:
        return self.rescue.max_calls(self.train_tasks[index]) if self.rescue else 0

    def _episode(self, group_id: str, episode_id: str, task, on_done=None, prefix_calls: int = 0) -> Episode:
        with self._counter_lock:
            n = next(self._counter)
        worker = n % len(self.workers)
        prefix = self.rescue.prefix(task, prefix_calls) if prefix_calls else None
        with self.env_slots.take() as env:
            run = run_episode(env, self.workers[worker], task, episode_id, self.server_urls[worker], self.settings,
                              prefix=prefix)
        episode = Episode(group_id=group_id, reward=run.record.reward, sequences=run.sequences, record=run.record)
        if on_done is not None:
            on_done(episode)
        return episode
