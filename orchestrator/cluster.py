"""Connecting to Ray, placing the actors, and building them: the one place where train,
eval and tests construct rollout workers, env actors and learners.

Embedded mode (`ray.address: null`) starts a private Ray with enough logical CPUs for the
actors; under `ray job submit` (`ray.address: auto`) the job joins the cluster. Every actor
gets an explicit `num_cpus` beside its GPU fraction (a GPU-only actor still reserves a
CPU, which deadlocks small boxes), and all of them go into one placement group whose
bundles are the actors' resource shapes, so fractional GPUs share a card by config alone.
"""
from __future__ import annotations

import os
from pathlib import Path

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.engine import engine_env_vars
from actors.env_actor import EnvActor
from actors.learner_group import LearnerGroup
from actors.recording_proxy import RecordingProxy
from actors.rollout_worker import RolloutWorker
from orchestrator.evaluator import Evaluator
from orchestrator.harvest import Harvester
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


def _unplaced(cfg: RunConfig, role: str, threads: int = 1) -> dict:
    """Options without a placement group (eval and tests): the same resource shape."""
    shape = bundles(cfg)[role][0]
    return {"num_cpus": shape["CPU"], "num_gpus": shape.get("GPU", 0), "runtime_env": actor_env(cfg, threads)}


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
    return worker, ray.get(worker.start_server.remote())


def spawn_env_actors(cfg: RunConfig, placement: Placement | None = None) -> list:
    """env.num_env_actors EnvActors; each serves pool_size episodes plus one control call at once."""
    return [ray.remote(EnvActor).options(**_options(cfg, placement, "env", i), max_concurrency=cfg.env.pool_size + 1)
            .remote(cfg.env) for i in range(cfg.env.num_env_actors)]


def spawn_evaluator(cfg: RunConfig, out_dir: str, num_cpus: float = 0.1, harvest: bool = False):
    """The Evaluator actor (or the Harvester, which also keeps rows of successes); it mostly
    waits on other actors, so it asks for little CPU."""
    return ray.remote(Harvester if harvest else Evaluator).options(num_cpus=num_cpus).remote(cfg, out_dir)


def start_recording_proxy(cfg: RunConfig, upstream: str, upstream_model: str, api_key: str | None) -> tuple:
    """A RecordingProxy in front of another OpenAI-compatible endpoint: (handle, base_url)."""
    connect(cfg)
    proxy = ray.remote(RecordingProxy).options(num_cpus=0.1, max_concurrency=8).remote(
        upstream, upstream_model, api_key, resolve_model_path(cfg.model.path), cfg.rollout.server_host)
    return proxy, ray.get(proxy.start.remote())


def spawn_learners(cfg: RunConfig, model_path: str, placement: Placement | None = None,
                   threads: int | None = None) -> LearnerGroup:
    """learner.num_learners Learner actors as one group (size 1 is a single actor)."""
    threads = threads or cfg.learner.torch_threads
    options = [_options(cfg, placement, "learner", i, threads) for i in range(cfg.learner.num_learners)]
    return LearnerGroup(cfg, model_path, options)
