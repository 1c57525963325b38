"""Connecting to Ray and placing the actors.

Embedded mode (`ray.address: null`) starts a private Ray with enough logical CPUs for the
actors; under `ray job submit` (`ray.address: auto`) the job joins the cluster. Every actor
gets an explicit `num_cpus` beside its GPU fraction (a GPU-only actor still reserves a
CPU, which deadlocks small boxes), and all of them go into one placement group whose
bundles are the actors' resource shapes, so fractional GPUs share a card by config alone.
"""
from __future__ import annotations

import os

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl.config import RunConfig


def actor_env(cfg: RunConfig, threads: int) -> dict:
    """Environment for actor processes: thread counts and vLLM's CPU knobs, set before import."""
    return {"env_vars": {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.rollout.cpu_kvcache_gib),
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if cfg.ray.expandable_segments else "",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
        "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off for the data-parallel learner group
    }}


def bundles(cfg: RunConfig) -> dict[str, list[dict]]:
    def shape(cpus: float, gpus: float) -> dict:
        return {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})}
    return {
        "rollout": [shape(cfg.rollout.num_cpus, cfg.rollout.num_gpus)] * cfg.rollout.num_workers,
        "learner": [shape(cfg.learner.num_cpus, cfg.learner.num_gpus)] * cfg.learner.num_learners,
        "env": [shape(cfg.env.num_cpus, 0)] * cfg.env.num_env_actors,
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
                f"num_cpus/num_gpus of rollout/learner/env or add nodes")

    def options(self, role: str, i: int, cfg: RunConfig, threads: int = 1) -> dict:
        shape = self.shapes[role][i]
        return {"num_cpus": shape["CPU"], "num_gpus": shape.get("GPU", 0),
                "runtime_env": actor_env(cfg, threads),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=self.offsets[role] + i)}
