"""Connecting to Ray, placing the actors, and building them: the one place where train,
eval and tests construct rollout workers, env actors and learners.

Embedded mode (`ray.address: null`) starts a private Ray with enough logical CPUs for the
actors; under `ray job submit` (`ray.address: auto`) the job joins the cluster. Every actor
gets an explicit `num_cpus` beside its GPU fraction (a GPU-only actor still reserves a
CPU, which deadlocks small boxes), and all of them go into one placement group whose
bundles are the actors' resource shapes, so fractional GPUs share a card by config alone.
Actors are named for what they are (`rollout-0`, `learner-0`, `env-0`, `evaluator`), which is
how the dashboard's Actors page lists them; a training run's actors copy their output into
`<run_dir>/logs/<name>.log` (actors/logfiles.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.engine import engine_env_vars
from actors.env_actor import EnvActor
from actors.learner_group import LearnerGroup
from actors.logfiles import LOG_ENV, with_output_copied
from actors.recording_proxy import RecordingProxy
from actors.rollout_worker import RolloutWorker
from orchestrator.evaluator import Evaluator
from orchestrator.harvest import Harvester
from rl.config import RunConfig
from rl.default_model import resolve_model_path


def actor_env(cfg: RunConfig, threads: int, log_file: Path | None = None) -> dict:
    """Environment for actor processes: thread counts and vLLM's CPU knobs, set before import;
    with log_file, the actor's output is also copied there."""
    env = {"env_vars": {
        **engine_env_vars(cfg.rollout, threads),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if cfg.ray.expandable_segments else "",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
        "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off for the data-parallel learner group
        "VLLM_LOGGING_LEVEL": cfg.logging.engine_level,
    }}
    if log_file is not None:
        env["env_vars"][LOG_ENV] = str(Path(log_file).resolve())
    return env


def actor_name(role: str, i: int | None = None) -> str:
    """`rollout-0`, `env-1`, `evaluator`: the first free name of that form in this job's
    namespace (a test or an evaluation may build a second set of actors beside the first)."""
    base = role if i is None else f"{role}-{i}"
    name, n = base, 1
    while _name_taken(name):
        name, n = f"{base}.{n}", n + 1
    return name


def _name_taken(name: str) -> bool:
    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def bundles(cfg: RunConfig) -> dict[str, list[dict]]:
    def shape(cpus: float, gpus: float) -> dict:
        return {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})}
    return {
        "rollout": [shape(cfg.rollout.num_cpus, cfg.rollout.num_gpus)] * cfg.rollout.num_workers,
        "learner": [shape(cfg.learner.num_cpus, cfg.learner.num_gpus)] * cfg.learner.num_learners,
        "env": [shape(cfg.env.num_cpus, 0)] * cfg.env.num_env_actors,
    }


def connect(cfg: RunConfig, echo: bool = True) -> None:
    """echo=False keeps the actors' output off this process's console (a training run copies
    it into its run folder instead)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, log_to_driver=echo)
        return
    ray.init(num_cpus=max(os.cpu_count() or 1, int(cpus_needed(cfg) + 0.999)), include_dashboard=False,
             log_to_driver=echo, configure_logging=False)


def cpus_needed(cfg: RunConfig) -> float:
    return sum(b["CPU"] for group in bundles(cfg).values() for b in group)


class Placement:
    """One placement group; `strategy(role, i)` places the i-th actor of a role on its bundle."""

    def __init__(self, cfg: RunConfig, log_dir: Path | None = None):
        self.log_dir = log_dir
        self.shapes = bundles(cfg)
        flat, self.offsets = [], {}
        for role, group in self.shapes.items():
            self.offsets[role] = len(flat)
            flat.extend(group)
        self.group = placement_group(flat, strategy=cfg.ray.placement_strategy)
        ready, _ = ray.wait([self.group.ready()], timeout=120)
        if not ready:
            remove_placement_group(self.group)
            raise RuntimeError(placement_failure(cfg, flat, ray.cluster_resources()))

    def options(self, role: str, i: int, cfg: RunConfig, threads: int = 1) -> dict:
        shape = self.shapes[role][i]
        name = actor_name(role, i)
        log_file = self.log_dir / f"{name}.log" if self.log_dir is not None else None
        return {"num_cpus": shape["CPU"], "num_gpus": shape.get("GPU", 0), "name": name,
                "runtime_env": actor_env(cfg, threads, log_file),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=self.offsets[role] + i)}


def placement_failure(cfg: RunConfig, flat: list[dict], cluster: dict) -> str:
    """Why the actors did not fit, and the two ways out: a bigger head, or smaller shapes."""
    cpus, gpus = cpus_needed(cfg), sum(b.get("GPU", 0) for b in flat)
    lines = [f"Ray could not place the actors' bundles {flat} within 120 s: they need {cpus:g} CPU"
             + (f" and {gpus:g} GPU" if gpus else "") + f"; the cluster has {cluster.get('CPU', 0):g} CPU"
             + (f" and {cluster.get('GPU', 0):g} GPU" if gpus else "") + " in all (some may be taken by other jobs).",
             f"  - a local head: start it with `ray start --head --num-cpus={int(cpus + 0.999)}"
             + (f" --num-gpus={int(gpus + 0.999)}" if gpus else "") + "` (logical CPUs may exceed the cores)",
             f"  - or shrink the run: rollout.num_cpus={cfg.rollout.num_cpus:g} x rollout.num_workers="
             f"{cfg.rollout.num_workers}, learner.num_cpus={cfg.learner.num_cpus:g} x learner.num_learners="
             f"{cfg.learner.num_learners}, env.num_cpus={cfg.env.num_cpus:g} x env.num_env_actors="
             f"{cfg.env.num_env_actors}" + (", and the num_gpus keys of the same sections" if gpus else "")]
    return "\n".join(lines)


def _unplaced(cfg: RunConfig, role: str, i: int = 0, threads: int = 1) -> dict:
    """Options without a placement group (eval and tests): the same resource shape."""
    shape = bundles(cfg)[role][0]
    return {"num_cpus": shape["CPU"], "num_gpus": shape.get("GPU", 0), "name": actor_name(role, i),
            "runtime_env": actor_env(cfg, threads)}


def _options(cfg: RunConfig, placement: Placement | None, role: str, i: int, threads: int = 1) -> dict:
    return placement.options(role, i, cfg, threads) if placement is not None else _unplaced(cfg, role, i, threads)


def spawn_rollout_workers(cfg: RunConfig, model_path: str, placement: Placement | None = None,
                          enable_lora: bool | None = None, count: int | None = None) -> list:
    """RolloutWorker actors serving model_path (rollout.num_workers of them; LoRA on unless
    sync is merged)."""
    lora = cfg.sync.strategy == "lora" if enable_lora is None else enable_lora
    threads = max(1, int(cfg.rollout.num_cpus))
    return [ray.remote(with_output_copied(RolloutWorker)).options(**_options(cfg, placement, "rollout", i, threads))
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
    return [ray.remote(with_output_copied(EnvActor)).options(**_options(cfg, placement, "env", i), max_concurrency=cfg.env.pool_size + 1)
            .remote(cfg.env) for i in range(cfg.env.num_env_actors)]


def spawn_evaluator(cfg: RunConfig, out_dir: str, num_cpus: float = 0.1, harvest: bool = False):
    """The Evaluator actor (or the Harvester, which also keeps rows of successes); it mostly
    waits on other actors, so it asks for little CPU."""
    cls, name = (Harvester, "harvester") if harvest else (Evaluator, "evaluator")
    return ray.remote(cls).options(num_cpus=num_cpus, name=actor_name(name)).remote(cfg, out_dir)


def start_recording_proxy(cfg: RunConfig, upstream: str, upstream_model: str, api_key: str | None) -> tuple:
    """A RecordingProxy in front of another OpenAI-compatible endpoint: (handle, base_url)."""
    connect(cfg)
    proxy = ray.remote(RecordingProxy).options(num_cpus=0.1, max_concurrency=8, name=actor_name("proxy")).remote(
        upstream, upstream_model, api_key, resolve_model_path(cfg.model.path), cfg.rollout.server_host)
    return proxy, ray.get(proxy.start.remote())


def spawn_learners(cfg: RunConfig, model_path: str, placement: Placement | None = None,
                   threads: int | None = None) -> LearnerGroup:
    """learner.num_learners Learner actors as one group (size 1 is a single actor)."""
    threads = threads or cfg.learner.torch_threads
    options = [_options(cfg, placement, "learner", i, threads) for i in range(cfg.learner.num_learners)]
    return LearnerGroup(cfg, model_path, options)
