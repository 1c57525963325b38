"""Connecting to Ray, placing the actors, and building them: the one place where train,
eval and tests construct rollout workers, env actors and learners.

Embedded mode (`ray.address: null`) starts a private Ray with enough logical CPUs for the
actors; under `ray job submit` (`ray.address: auto`) the job joins the cluster. Every actor
gets an explicit `num_cpus` beside its GPU fraction (a GPU-only actor still reserves a
CPU, which deadlocks small boxes), and all of them go into one placement group whose
bundles are the actors' resource shapes, so fractional GPUs share a card by config alone.
On several nodes, `ray.placement_strategy` spreads the bundles and `ray.role_resources`
adds custom resources to a role's bundles, pinning it to the nodes that offer them.
`Placement.nodes()` says where each actor landed (the metrics record it).
"""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.engine import engine_env_vars
from actors.env_actor import EnvActor
from actors.learner_group import LearnerGroup
from actors.rollout_worker import RolloutWorker
from orchestrator.evaluator import Evaluator
from orchestrator.node_check import check_env_node, distinct_sdists
from rl.config import RunConfig
from rl.default_model import resolve_model_path


def actor_env(cfg: RunConfig, threads: int) -> dict:
    """Environment for actor processes: thread counts and vLLM's CPU knobs, set before import."""
    return {"env_vars": {
        **engine_env_vars(cfg.rollout, threads),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if cfg.ray.expandable_segments else "",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
        "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off for the data-parallel learner group
    }}


def bundles(cfg: RunConfig) -> dict[str, list[dict]]:
    def shape(role: str, cpus: float, gpus: float) -> dict:
        return {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {}), **cfg.ray.role_resources.get(role, {})}
    return {
        "rollout": [shape("rollout", cfg.rollout.num_cpus, cfg.rollout.num_gpus)] * cfg.rollout.num_workers,
        "learner": [shape("learner", cfg.learner.num_cpus, cfg.learner.num_gpus)] * cfg.learner.num_learners,
        "env": [shape("env", cfg.env.num_cpus, 0)] * cfg.env.num_env_actors,
    }


def connect(cfg: RunConfig) -> None:
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, log_to_driver=True)
        return
    needed = sum(b["CPU"] for group in bundles(cfg).values() for b in group)
    ray.init(num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)), include_dashboard=False,
             log_to_driver=True, configure_logging=False)


class Placement:
    """One placement group; `strategy(role, i)` places the i-th actor of a role on its bundle."""

    def __init__(self, cfg: RunConfig):
        self.shapes = bundles(cfg)
        flat, self.offsets = [], {}
        for role, group in self.shapes.items():
            self.offsets[role] = len(flat)
            flat.extend(group)
        self.group = placement_group(flat, strategy=cfg.ray.placement_strategy)
        ready, _ = ray.wait([self.group.ready()], timeout=120)
        if not ready:
            raise RuntimeError(
                f"Ray could not place the actors' bundles {flat} within 120 s: the cluster lacks the "
                f"resources (ray.available_resources() = {ray.available_resources()}); lower the "
                f"num_cpus/num_gpus of rollout/learner/env, check ray.role_resources against the "
                f"nodes' --resources, or add nodes")

    def nodes(self) -> dict[str, str]:
        """{"rollout/0": node address, ...}: the node each actor's bundle was placed on."""
        node_ids = placement_group_table(self.group)["bundles_to_node_id"]
        address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        return {f"{role}/{i}": address.get(node_ids[self.offsets[role] + i], "?")
                for role, group in self.shapes.items() for i in range(len(group))}

    def spans_nodes(self) -> bool:
        return len(set(self.nodes().values())) > 1

    def options(self, role: str, i: int, cfg: RunConfig, threads: int = 1) -> dict:
        return {**_resource_options(self.shapes[role][i]), "runtime_env": actor_env(cfg, threads),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=self.offsets[role] + i)}


def _unplaced(cfg: RunConfig, role: str, threads: int = 1) -> dict:
    """Options without a placement group (eval and tests): the same resource shape."""
    return {**_resource_options(bundles(cfg)[role][0]), "runtime_env": actor_env(cfg, threads)}


def _resource_options(shape: dict) -> dict:
    custom = {k: v for k, v in shape.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": shape["CPU"], "num_gpus": shape.get("GPU", 0), **({"resources": custom} if custom else {})}


def alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n["Alive"])


def _options(cfg: RunConfig, placement: Placement | None, role: str, i: int, threads: int = 1) -> dict:
    return placement.options(role, i, cfg, threads) if placement is not None else _unplaced(cfg, role, threads)


def spawn_rollout_workers(cfg: RunConfig, model_path: str, placement: Placement | None = None,
                          enable_lora: bool | None = None, count: int | None = None) -> list:
    """RolloutWorker actors serving model_path (rollout.num_workers of them; LoRA on unless
    sync is merged)."""
    lora = cfg.sync.strategy == "lora" if enable_lora is None else enable_lora
    threads = max(1, int(cfg.rollout.num_cpus))
    return [ray.remote(RolloutWorker).options(**_options(cfg, placement, "rollout", i, threads))
            .remote(model_path, cfg.rollout, cfg.model, lora, cfg.learner.lora_rank)
            for i in range(cfg.rollout.num_workers if count is None else count)]


def start_policy(cfg: RunConfig, adapter: str | None = None) -> tuple:
    """One RolloutWorker serving the config's model (plus an optional LoRA adapter): (handle, base_url)."""
    connect(cfg)
    [worker] = spawn_rollout_workers(cfg, resolve_model_path(cfg.model.path), enable_lora=adapter is not None,
                                     count=1)
    if adapter:
        ray.get(worker.load_lora_adapter.remote(str(Path(adapter).resolve())))
    return worker, ray.get(worker.start_server.remote(alive_nodes() > 1))


def spawn_env_actors(cfg: RunConfig, placement: Placement | None = None, tasks: list | None = None,
                     scaffold: str | None = None) -> list:
    """env.num_env_actors EnvActors; each serves pool_size episodes plus one control call at
    once, and first checks its node (orchestrator.node_check) for the scaffold and tasks."""
    check = partial(check_env_node, scaffold or cfg.scaffold.name, distinct_sdists(tasks or []))
    actors = [ray.remote(EnvActor).options(**_options(cfg, placement, "env", i), max_concurrency=cfg.env.pool_size + 1)
              .remote(cfg.env, check) for i in range(cfg.env.num_env_actors)]
    ray.get([a.open_count.remote() for a in actors])  # a node that is not ready fails here, named
    return actors


def spawn_evaluator(cfg: RunConfig, out_dir: str, num_cpus: float = 0.1):
    """The Evaluator actor; it mostly waits on other actors, so it asks for little CPU."""
    return ray.remote(Evaluator).options(num_cpus=num_cpus).remote(cfg, out_dir)


def spawn_learners(cfg: RunConfig, model_path: str, placement: Placement | None = None,
                   threads: int | None = None) -> LearnerGroup:
    """learner.num_learners Learner actors as one group (size 1 is a single actor)."""
    threads = threads or cfg.learner.torch_threads
    options = [_options(cfg, placement, "learner", i, threads) for i in range(cfg.learner.num_learners)]
    return LearnerGroup(cfg, model_path, options)
