"""Data-parallel learner group: one Learner actor per bundle (per GPU), gradients all-reduced.

Every rank builds the same LoRA (same seed, then a broadcast from rank 0), trains on its
share of the batch and all-reduces gradients (NCCL on GPU, gloo on CPU), so all replicas
stay identical and the step equals one learner on the whole batch. Rank 0's metrics are
already global (the learner all-reduces its sums), and rank 0 writes every save.

The group mirrors a Ray actor handle: `group.train_step.remote(samples)` returns an
ObjectRef, so driver code written for one learner actor works unchanged; plain calls
(`group.train_step(samples)`) block and return the value.
"""
from __future__ import annotations

import socket
from typing import Any, Callable

import ray

from actors.learner import Learner
from rl.config import RunConfig
from rl.types import TrainSample


def split_by_tokens(samples: list[TrainSample], parts: int) -> list[list[TrainSample]]:
    """Largest-first greedy split that balances trained-sequence tokens across ranks."""
    shards: list[list[TrainSample]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for s in sorted(samples, key=lambda s: len(s.token_ids), reverse=True):
        i = loads.index(min(loads))
        shards[i].append(s)
        loads[i] += len(s.token_ids)
    return shards


@ray.remote
def _free_port() -> str:
    """host:port on the node that will host rank 0 (scheduled in rank 0's bundle)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"


class _Method:
    def __init__(self, call: Callable[..., ray.ObjectRef]):
        self._call = call

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return self._call(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return ray.get(self._call(*args, **kwargs))


class LearnerGroup:
    def __init__(self, cfg: RunConfig, model_path: str, placement=None, threads: int | None = None):
        """placement: an rl.ray_setup.Placement (its 'learner' bundles), or None for plain scheduling."""
        n = cfg.learner.num_learners
        threads = threads or cfg.learner.torch_threads
        if n < 2:
            raise ValueError("LearnerGroup is for learner.num_learners >= 2; use one Learner actor otherwise")
        options = [placement.options("learner", i, cfg, threads) if placement is not None else
                   {"num_cpus": cfg.learner.num_cpus, "num_gpus": cfg.learner.num_gpus,
                    "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(threads)}}}
                   for i in range(n)]
        port_opts = {k: v for k, v in options[0].items() if k == "scheduling_strategy"}
        addr = ray.get(_free_port.options(num_cpus=0, **port_opts).remote())
        actor_cls = ray.remote(Learner)
        self.world_size = n
        self.actors = [actor_cls.options(**options[r]).remote(
            model_path, cfg.learner, cfg.model, cfg.trainer.seed, rank=r, world_size=n, dist_addr=addr)
            for r in range(n)]
        ray.get([a.num_trainable_params.remote() for a in self.actors])  # surface init errors here

        self.train_step = _Method(self._train_step)
        self.sequence_logprobs = _Method(lambda ids: self.actors[0].sequence_logprobs.remote(ids))
        self.save_adapter = _Method(lambda path: self.actors[0].save_adapter.remote(path))
        self.save_merged = _Method(lambda path: self.actors[0].save_merged.remote(path))
        self.save_state = _Method(lambda path: self.actors[0].save_state.remote(path))
        self.load_state = _Method(self._load_state)
        self.num_trainable_params = _Method(lambda: self.actors[0].num_trainable_params.remote())

    def _train_step(self, samples: list[TrainSample]) -> ray.ObjectRef:
        shards = split_by_tokens(samples, self.world_size)
        refs = [a.train_step.remote(shard) for a, shard in zip(self.actors, shards)]
        return _first_after_all.remote(*refs)

    def _load_state(self, path: str) -> ray.ObjectRef:
        """Every rank loads the same files (the path must be readable from every node)."""
        return _first_after_all.remote(*[a.load_state.remote(path) for a in self.actors])

    def replica_refs(self, method: str, *args: Any) -> list[ray.ObjectRef]:
        """Call a method on every rank (tests and benchmarks compare replicas)."""
        return [getattr(a, method).remote(*args) for a in self.actors]

    def shutdown(self) -> None:
        ray.get([a.shutdown.remote() for a in self.actors])
        for a in self.actors:
            ray.kill(a)


@ray.remote(num_cpus=0)
def _first_after_all(*results: Any) -> Any:
    """Waits for every rank (a failed rank raises here) and returns rank 0's result."""
    return results[0]
