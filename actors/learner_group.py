"""Data-parallel learner group: one Learner actor per bundle (per GPU), gradients all-reduced.

Every rank builds the same LoRA (same seed, then a broadcast from rank 0), trains on its
share of the batch and all-reduces gradients (NCCL on GPU, gloo on CPU), so all replicas
stay identical and the step equals one learner on the whole batch. Rank 0's metrics are
already global (the learner all-reduces its sums), and rank 0 writes every save.

A group of size 1 is one actor with no process group, so the driver has one path for any
size. Its methods block and return values, except the `*_ref` ones, which hand back an
object ref that rollout workers resolve on their own nodes (the driver never holds the
weights). Checkpoints travel as values too: `save_state`/`load_state` read and write files
on the driver's node, so no node needs to see another's filesystem.

Example:
    group = LearnerGroup(cfg, model_path, [{"num_cpus": 1}] * cfg.learner.num_learners)
    metrics = group.train_step(samples)          # split by tokens, all-reduced
    path = group.save_adapter(f"{run_dir}/adapters/step_000001")
"""
from __future__ import annotations

import socket
from typing import Any

import ray

from actors.logfiles import with_output_copied
from rl.config import RunConfig
from rl.folders import read_folder, write_folder
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


class LearnerGroup:
    def __init__(self, cfg: RunConfig, model_path: str, options: list[dict], wait: bool = True):
        """options: the Ray actor options of each rank (orchestrator.cluster.spawn_learners builds them).
        wait=False returns while the ranks still build; `ready()` waits and raises their init errors."""
        from actors.learner import Learner  # torch: ~1.3 s of import the driver pays only when it builds one

        n = len(options)
        addr = None
        if n > 1:
            port_opts = {k: v for k, v in options[0].items() if k == "scheduling_strategy"}
            addr = ray.get(_free_port.options(num_cpus=0, **port_opts).remote())
        actor_cls = ray.remote(with_output_copied(Learner))
        self.world_size = n
        self.actors = [actor_cls.options(**options[r]).remote(
            model_path, cfg.learner, cfg.model, cfg.trainer.seed, rank=r, world_size=n, dist_addr=addr,
            lora=cfg.lora)
            for r in range(n)]
        self._building = [a.num_trainable_params.remote() for a in self.actors]
        if wait:
            self.ready()

    def ready(self) -> None:
        """Block until every rank is built; a rank's init error is raised here."""
        ray.get(self._building)

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step on the whole batch; rank 0's metrics are already global."""
        if self.world_size == 1:
            return ray.get(self.actors[0].train_step.remote(samples))
        shards = split_by_tokens(samples, self.world_size)
        return ray.get([a.train_step.remote(shard) for a, shard in zip(self.actors, shards)])[0]

    def load_state(self, path: str) -> None:
        """Every rank loads the checkpoint folder at path, read here and sent through Ray."""
        files = ray.put(read_folder(path))
        ray.get([a.load_state_files.remote(files) for a in self.actors])

    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        return ray.get(self.sequence_logprobs_ref(token_ids))

    def sequence_logprobs_ref(self, token_ids: list[int]) -> ray.ObjectRef:
        return self.actors[0].sequence_logprobs.remote(token_ids)

    def save_adapter(self, path: str) -> str:
        return ray.get(self.actors[0].save_adapter.remote(path))

    def save_merged(self, path: str) -> str:
        return ray.get(self.actors[0].save_merged.remote(path))

    def save_state(self, path: str) -> None:
        """Rank 0's state, written at path on this (the driver's) node."""
        write_folder(ray.get(self.actors[0].state_files.remote()), path)

    def adapter_files_ref(self) -> ray.ObjectRef:
        """The LoRA adapter folder as a value in the object store (Learner.adapter_files)."""
        return self.actors[0].adapter_files.remote()

    def merged_weights_ref(self) -> ray.ObjectRef:
        """The merged weights as CPU tensors in the object store (Learner.merged_weights)."""
        return self.actors[0].merged_weights.remote()

    def lora_factors_ref(self) -> ray.ObjectRef:
        """The LoRA factors of every adapted weight in the object store (Learner.lora_factors)."""
        return self.actors[0].lora_factors.remote()

    def num_trainable_params(self) -> int:
        return ray.get(self.actors[0].num_trainable_params.remote())

    def replica_refs(self, method: str, *args: Any) -> list[ray.ObjectRef]:
        """Call a method on every rank (tests and benchmarks compare replicas)."""
        return [getattr(a, method).remote(*args) for a in self.actors]

    def shutdown(self) -> None:
        ray.get([a.shutdown.remote() for a in self.actors])
        for a in self.actors:
            ray.kill(a)
