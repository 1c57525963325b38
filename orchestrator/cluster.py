"""Connecting to Ray, placing the actors, and building them: the one place where train,
eval and tests construct rollout workers, env actors and learners.

Embedded mode (`ray.address: null`) starts a private Ray with enough logical CPUs for the
actors; under `ray job submit` (`ray.address: auto`) the job joins the cluster. Every actor
gets an explicit `num_cpus` beside its GPU fraction (a GPU-only actor still reserves a
CPU, which deadlocks small boxes), and all of them go into one placement group whose
bundles are the actors' resource shapes, so fractional GPUs share a card by config alone.
Actors are named for what they are (`rollout-0`, `learner-0`, `env-0`, `evaluator`), which is
how the dashboard's Actors page lists them; a training run's actors copy their output into
`<run_dir>/logs/<name>.log` on the driver's node, those on other nodes through a `log-sink`
actor there (actors/logfiles.py).

On several nodes, `ray.placement_strategy` spreads the bundles and `ray.role_resources`
adds custom resources to a role's bundles, pinning it to the nodes that offer them.
`Placement.nodes()` says where each actor landed (the metrics record it).
"""
from __future__ import annotations

import os
import re
import time
from functools import partial
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from actors.engine import engine_env_vars
from actors.env_actor import EnvActor
from actors.learner_group import LearnerGroup
from actors.logfiles import LOG_ENV, LOG_NODE_ENV, LOG_SINK_ENV, LogSink, with_output_copied
from actors.recording_proxy import RecordingProxy
from actors.rollout_worker import RolloutWorker
from modeling.default_model import resolve_model_path
from orchestrator.evaluator import Evaluator
from orchestrator.harvest import Harvester
from orchestrator.node_check import check_env_node, distinct_sdists
from rl.config import RunConfig


def actor_env(cfg: RunConfig, threads: int, log_file: Path | None = None, log_route: dict | None = None) -> dict:
    """Environment for actor processes: thread counts and vLLM's CPU knobs, set before import;
    with log_file, the actor's output is also copied there (by way of log_route's sink from
    another node)."""
    env = {"env_vars": {
        **engine_env_vars(cfg.rollout, threads),   # VLLM_ENABLE_V1_MULTIPROCESSING: rollout.engine_core
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if cfg.ray.expandable_segments else "",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
        "NCCL_NVLS_ENABLE": "0",  # NVLink multicast off for the data-parallel learner group
        "VLLM_LOGGING_LEVEL": cfg.logging.engine_level,
    }}
    if log_file is not None:
        env["env_vars"][LOG_ENV] = str(Path(log_file).resolve())
        env["env_vars"].update(log_route or {})
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
    def shape(role: str, cpus: float, gpus: float) -> dict:
        return {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {}), **cfg.ray.role_resources.get(role, {})}
    return {
        "rollout": [shape("rollout", cfg.rollout.num_cpus, cfg.rollout.num_gpus)] * cfg.rollout.num_workers,
        "learner": [shape("learner", cfg.learner.num_cpus, cfg.learner.num_gpus)] * cfg.learner.num_learners,
        "env": [shape("env", cfg.env.num_cpus, 0)] * cfg.env.num_env_actors,
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
            alive = [{"address": n["NodeManagerAddress"], "resources": n["Resources"]} for n in ray.nodes()
                     if n["Alive"]]
            raise RuntimeError(placement_failure(cfg, flat, ray.cluster_resources(), alive))
        self.node_ids = dict(placement_group_table(self.group)["bundles_to_node_id"])  # bundle -> node, as placed
        self.names: dict[str, str] = {}  # "learner/0" -> the actor's name, as named in options()
        self.log_route = self._log_route() if log_dir is not None else {}

    def _log_route(self) -> dict[str, str]:
        """The env vars that send the logs of actors placed off the driver's node to a LogSink
        on it (started only then)."""
        here = ray.get_runtime_context().get_node_id()
        if set(placement_group_table(self.group)["bundles_to_node_id"].values()) <= {here}:
            return {LOG_NODE_ENV: here}
        name = actor_name("log-sink")
        self.log_sink = ray.remote(LogSink).options(
            name=name, num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
        ).remote(str(Path(self.log_dir).resolve()))
        ray.get(self.log_sink.__ray_ready__.remote())
        return {LOG_NODE_ENV: here, LOG_SINK_ENV: name}

    def nodes(self) -> dict[str, str]:
        """{"rollout/0": node address, ...}: the node each actor's bundle was placed on."""
        node_ids = placement_group_table(self.group)["bundles_to_node_id"]
        address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        return {f"{role}/{i}": address.get(node_ids[self.offsets[role] + i], "?")
                for role, group in self.shapes.items() for i in range(len(group))}

    def spans_nodes(self) -> bool:
        return len(set(self.nodes().values())) > 1

    def options(self, role: str, i: int, cfg: RunConfig, threads: int = 1) -> dict:
        shape = self.shapes[role][i]
        name = self.names[f"{role}/{i}"] = actor_name(role, i)
        log_file = self.log_dir / f"{name}.log" if self.log_dir is not None else None
        return {**_resource_options(shape), "name": name,
                "runtime_env": actor_env(cfg, threads, log_file, self.log_route),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=self.offsets[role] + i)}


    def lost_nodes(self, wait_s: float = 0.0) -> dict[str, list[str]]:
        """{address of a node that has died: names of this placement's actors that were on it},
        polling up to wait_s for Ray to declare the node dead (its health checks take a while
        after an actor on it has already failed)."""
        deadline = time.monotonic() + wait_s
        while True:
            nodes = {n["NodeID"]: n for n in ray.nodes()}
            dead: dict[str, list[str]] = {}
            for slot, name in self.names.items():   # the actors built, not every bundle
                role, i = slot.split("/")
                node = nodes.get(self.node_ids[self.offsets[role] + int(i)])
                if node is not None and not node["Alive"]:
                    dead.setdefault(node["NodeManagerAddress"], []).append(name)
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(1.0)


class ActorLost(RuntimeError):
    """One of a run's actors is gone -- its node died, or Ray's memory monitor killed it; the
    message says which, where the run stands, and the resume command (`rlvr train` prints it
    as one line, without a traceback)."""


def causes(error: BaseException | None):
    """The error and the ones it was raised from or during."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _resume_hint(checkpoint: int | None, run_dir: Path) -> str:
    kept = f"its last checkpoint is step {checkpoint}" if checkpoint else "it has no checkpoint yet (a resume starts over)"
    run = Path(run_dir).resolve()
    return (f"The run directory keeps every finished episode of the step and {kept}; resume with "
            f"`rlvr train --resume {run}` (under `ray job submit`, the entrypoint "
            f"`python -m cli.main train --resume {run}`)")


def node_died_message(dead: dict[str, list[str]], step: int, checkpoint: int | None, run_dir: Path,
                      error: BaseException) -> str:
    """What a run that lost a node says: which actors, where, the step, and how to resume."""
    lost = "; ".join(f"{', '.join(names)} on {address}" for address, names in dead.items())
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return (f"node died during step {step}: {lost} went with it ({type(error).__name__}: {first}). "
            f"{_resume_hint(checkpoint, run_dir)} once the cluster offers the node's resources again.")


# Ray's memory monitor (the raylet) words every kill this way, in the OutOfMemoryError a caller
# gets and in the dead actor's death cause alike (Ray 2.60)
_OOM_MARK = "killed due to the node running low on memory"


def memory_kill_report(error: BaseException, names: list[str]) -> str | None:
    """The memory monitor's report of a kill behind `error`, or None: from the error chain (a call
    on the killed actor raises ray.exceptions.OutOfMemoryError; an actor error may carry the
    same words), else from the death cause Ray keeps for a dead actor among `names` (one whose
    death surfaced another way: a rollout worker's episodes failing through its server)."""
    for c in causes(error):
        if isinstance(c, ray.exceptions.OutOfMemoryError) or (
                isinstance(c, ray.exceptions.RayActorError) and _OOM_MARK in str(c)):
            return str(c)
    if not names:
        return None
    from ray._private.state import actors  # the GCS actor table: the death causes (no dashboard needed)

    for info in actors(job_id=ray.JobID.from_hex(ray.get_runtime_context().get_job_id()),
                       actor_state_name="DEAD").values():
        cause = str(info.get("DeathCause", ""))
        if info.get("Name") in names and "oom_context" in cause:
            return cause.replace("\\n", "\n")
    return None


def memory_killed_message(report: str, step: int, checkpoint: int | None, run_dir: Path) -> str:
    """One line from the memory monitor's report: which actor, the memory it held, the node's use
    against Ray's kill threshold, and how to resume."""
    def find(pattern: str) -> re.Match | None:
        return re.search(pattern, report)

    name, held = find(r"task name=([^:,\s]+)"), find(r"actual memory used=([0-9.]+) ?GB")
    node, threshold = find(r"was ([0-9.]+) ?GB used / ([0-9.]+) ?GB limit"), find(r"threshold of \d+B \(([0-9.]+)%")
    who = name.group(1) if name else "an actor of this run"
    parts = [f"it held {float(held.group(1)):.1f} GB"] if held else []
    if node:
        parts.append(f"the node had {float(node.group(1)):.1f} GB of its {float(node.group(2)):.1f} GB in use"
                     + (f", past Ray's kill threshold of {float(threshold.group(1)):.0f}%" if threshold else ""))
    when = f"during step {step}" if step else "while the run started"
    return (f"{who} was killed by Ray's memory monitor {when}"
            + (f" ({'; '.join(parts)})" if parts else "") + f". {_resume_hint(checkpoint, run_dir)} when the "
            "node has more memory free (RAY_memory_usage_threshold, read when Ray starts, moves the threshold).")


def placement_failure(cfg: RunConfig, flat: list[dict], cluster: dict, nodes: list[dict] = ()) -> str:
    """Why the actors did not fit, and the two ways out: a bigger head, or smaller shapes.
    With roles pinned to node kinds, a kind whose nodes lack the CPUs its bundles ask for is
    named first: the cluster's total can fit while one kind of node does not."""
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
    if cfg.ray.role_resources:
        lines.append(f"  - or check ray.role_resources {cfg.ray.role_resources} against the nodes' `ray start "
                     "--resources`")
    kinds = sorted({key for pins in cfg.ray.role_resources.values() for key in pins})
    for kind in kinds if nodes else ():
        need = sum(b["CPU"] for b in flat if kind in b)
        offer = {n["address"]: n["resources"].get("CPU", 0) for n in nodes if kind in n["resources"]}
        if not offer:
            lines.insert(1, f"  - no node offers {kind}: start one with "
                            f"`ray start ... --resources='{{\"{kind}\": 100}}'`")
        elif need > sum(offer.values()):
            have = ", ".join(f"{address}: {cpus:g}" for address, cpus in offer.items())
            lines.insert(1, f"  - the bundles pinned to {kind} need {need:g} CPU; the nodes with {kind} have "
                            f"{sum(offer.values()):g} ({have}): start them with `ray start ... --num-cpus="
                            f"{int(need + 0.999)}` or more (logical CPUs may exceed the cores)")
    return "\n".join(lines)


def _unplaced(cfg: RunConfig, role: str, i: int = 0, threads: int = 1) -> dict:
    """Options without a placement group (eval and tests): the same resource shape."""
    return {**_resource_options(bundles(cfg)[role][0]), "name": actor_name(role, i),
            "runtime_env": actor_env(cfg, threads)}


def _resource_options(shape: dict) -> dict:
    custom = {k: v for k, v in shape.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": shape["CPU"], "num_gpus": shape.get("GPU", 0), **({"resources": custom} if custom else {})}


def alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n["Alive"])


def _options(cfg: RunConfig, placement: Placement | None, role: str, i: int, threads: int = 1) -> dict:
    return placement.options(role, i, cfg, threads) if placement is not None else _unplaced(cfg, role, i, threads)


def spawn_rollout_workers(cfg: RunConfig, model_path: str, placement: Placement | None = None,
                          enable_lora: bool | None = None, count: int | None = None) -> list:
    """RolloutWorker actors serving model_path (rollout.num_workers of them; LoRA on unless
    sync is merged)."""
    lora = cfg.sync.strategy == "lora" if enable_lora is None else enable_lora
    threads = max(1, int(cfg.rollout.num_cpus))
    return [ray.remote(with_output_copied(RolloutWorker)).options(**_options(cfg, placement, "rollout", i, threads))
            .remote(model_path, cfg.rollout, cfg.model, lora, cfg.lora.rank)
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
    actors = [ray.remote(with_output_copied(EnvActor)).options(**_options(cfg, placement, "env", i), max_concurrency=cfg.env.pool_size + 1)
              .remote(cfg.env, check) for i in range(cfg.env.num_env_actors)]
    ray.get([a.open_count.remote() for a in actors])  # a node that is not ready fails here, named
    return actors


def run_evaluator(cfg: RunConfig, out_dir: str, tasks: list, base_url: str, model_id: str, env_actors: list,
                  worker, harvest: bool = False) -> dict:
    """Spawn the Evaluator (or Harvester), run its episodes, return its report. However this
    ends (done, an error, an interrupt such as a batch job's time limit), the Evaluator is
    stopped first: env actors that shut down end the agents of the episodes still in flight,
    and an Evaluator still running would record those as the policy's failures."""
    evaluator = spawn_evaluator(cfg, out_dir, harvest=harvest)
    try:
        return ray.get(evaluator.run.remote(tasks, base_url, model_id, env_actors, worker))
    finally:
        ray.kill(evaluator, no_restart=True)


def spawn_evaluator(cfg: RunConfig, out_dir: str, num_cpus: float = 0.1, harvest: bool = False):
    """The Evaluator actor (or the Harvester, which also keeps rows of successes); it mostly
    waits on other actors, so it asks for little CPU."""
    cls, name = (Harvester, "harvester") if harvest else (Evaluator, "evaluator")
    return ray.remote(cls).options(num_cpus=num_cpus, name=actor_name(name)).remote(cfg, out_dir)


def start_recording_proxy(cfg: RunConfig, upstream: str, upstream_model: str, api_key: str | None) -> tuple:
    """A RecordingProxy in front of another OpenAI-compatible endpoint: (handle, base_url)."""
    connect(cfg)
    proxy = ray.remote(RecordingProxy).options(num_cpus=0.1, max_concurrency=8, name=actor_name("proxy")).remote(
        upstream, upstream_model, api_key, resolve_model_path(cfg.model.path), cfg.rollout.server_host,
        spans_nodes=alive_nodes() > 1)
    return proxy, ray.get(proxy.start.remote())


def spawn_learners(cfg: RunConfig, model_path: str, placement: Placement | None = None,
                   threads: int | None = None, wait: bool = True) -> LearnerGroup:
    """learner.num_learners Learner actors as one group (size 1 is a single actor); wait=False
    returns while they build (LearnerGroup.ready waits)."""
    threads = threads or cfg.learner.torch_threads
    options = [_options(cfg, placement, "learner", i, threads) for i in range(cfg.learner.num_learners)]
    return LearnerGroup(cfg, model_path, options, wait)
