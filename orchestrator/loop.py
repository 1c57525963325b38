"""The step loop: roll out, score, learn, sync, probe, log, checkpoint.

Nothing here holds state that a checkpoint does not: a run directory plus its config is
enough to resume. One step, as data: groups of episodes from the rollout workers (tying
groups replaced, with dynamic sampling: orchestrator/sampling.py) -> group-relative
advantages -> one learner update -> weight sync -> parity probe.

With `trainer.rollout_ahead` the next step's rollouts run in a thread while the learner
trains (one step off-policy, as verl's and prime-rl's one-step-async modes); the loop waits
for them before the sync, so the engine's weights never change under a running episode.
The sync and its parity probe are then only issued (`IssuedSync`): the engines apply them
while the learner trains the next step, and the rollout after that waits for them before its
first request. A step's record then carries the probe of the previous step's sync.

Start-up puts the first rollout request first: the engine is spawned as soon as Ray is up,
and a fresh run's first step rolls out (on the base weights, which are the learner's: LoRA
starts at zero) as soon as the engine answers, while the learner builds and the start probe
waits for it.
"""
from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import ray

from modeling.default_model import model_dir, resolve_model_path
from orchestrator.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from orchestrator.cluster import (
    ActorLost,
    Placement,
    causes,
    connect,
    memory_kill_report,
    memory_killed_message,
    node_died_message,
    spawn_learners,
    spawn_rollout_workers,
)
from orchestrator.console import Console
from orchestrator.episode_store import EpisodeStore
from orchestrator.metrics import MetricsLog, read_metrics, step_time_budget, timed
from orchestrator.parity import finish_parity_probe, run_parity_probe
from orchestrator.plots import plot_reward_curve
from orchestrator.rollouts.agentic import AgenticRollouts
from orchestrator.rollouts.base import Episode, Rollouts
from orchestrator.rollouts.length import LengthRollouts
from orchestrator.sampling import StepGroups, collect_step
from orchestrator.storage import RunStorage
from orchestrator.tracker import Tracker
from orchestrator.weight_sync import IssuedSync, WeightSync, make_weight_sync
from rl.advantages import group_advantages
from rl.config import RunConfig, dump_config
from rl.grpo import sampled_entropy
from rl.types import TrainSample


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, weight_sync: WeightSync | None = None,
                 before_actors: Callable[[], None] | None = None, deadline: float | None = None):
        """deadline: a time.time() after which no new step starts (a batch job's time limit): the
        run stops at the step boundary before it, checkpointed, and resumes with --resume."""
        self.cfg = cfg
        self.deadline = deadline
        self.before_actors = before_actors  # the preflight's wait: runs once Ray is up, before any actor
        self.run_dir = Path(run_dir or cfg.trainer.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.weight_sync = weight_sync or make_weight_sync(cfg.sync.strategy, self.run_dir, cfg.sync.transport,
                                                           cfg.sync.bucket_mib)
        self.storage = RunStorage(cfg.trainer.storage, self.run_dir) if cfg.trainer.storage else None
        if self.storage and latest_checkpoint(self.run_dir) is None and self.storage.has_checkpoint():
            print(f"[rlvr] run directory has no checkpoint; pulling the run from {self.storage.uri}", flush=True)
            self.storage.pull()
        self.store = EpisodeStore(self.run_dir)
        self.console = Console(cfg.trainer.steps, cfg.logging.progress)
        self._ahead: dict[int, Future] = {}  # step -> its rollouts, started while the previous step learned
        self._on_policy: set[int] = set()  # steps in _ahead rolled out on the learner's current weights
        self._start_probe = None  # a fresh run's start probe, issued before its first rollout
        self._issued: IssuedSync | None = None  # the last overlapped step's sync, applied while the next one learns
        self._last_probe: tuple[float, float] = (0.0, 0.0)  # the latest completed parity probe (mean, max)
        self._step = 0  # the step in flight (a failure names it)

    # ---- set-up ------------------------------------------------------------------
    def _start(self, roll_first_step: bool = False) -> None:
        """Ray, the actors, the env; with roll_first_step, a fresh run's step 1 starts rolling out here."""
        cfg = self.cfg
        phases: dict[str, float] = {}  # where start-up goes; the learner builds beside the engine
        with timed("ray", phases):
            connect(cfg, echo=cfg.logging.console == "debug")  # actor output: <run_dir>/logs
        # the engine's start is the critical path, so it is spawned before the preflight's verdict when
        # the model folder is already there (a failed check then takes it down with Ray; the checks read
        # the GPU's free memory first thing, seconds before an engine could allocate any); on a fresh run
        # the learner is spawned only once the engine answers (on a small host their imports share the cores)
        early = _model_folder_exists(cfg.model.path)
        if early:
            with timed("setup", phases):
                self._spawn_engines()
        if self.before_actors:
            with timed("preflight", phases):  # the checks ran while Ray started; a failure stops here
                self._wait_preflight()
        with timed("setup", phases):  # model folder, tokenizer, placement group
            if not early:
                self._spawn_engines()
            # imported only now: transformers' lazy module is not safe to import from two threads at once,
            # and the preflight thread imports it while Ray starts
            from transformers import AutoTokenizer
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        print(f"[rlvr] run dir {self.run_dir}; model {self.model_path}; "
              f"{cfg.rollout.num_workers} rollout worker(s), {cfg.learner.num_learners} learner(s)", flush=True)
        roll_first_step = roll_first_step and latest_checkpoint(self.run_dir) is None
        if not roll_first_step:
            self.learner = spawn_learners(cfg, self.model_path, self.placement, wait=False)
        self.parity_ids = self.tokenizer(cfg.sync.parity_text)["input_ids"]
        with timed("engine_and_env", phases):  # the env actors start while the engines load
            self.rollouts: Rollouts = (LengthRollouts(cfg, self.tokenizer, self.workers) if cfg.task.kind == "length"
                                       else AgenticRollouts(cfg, self.run_dir, self.workers, self.placement))
            ray.get([w.chat_template_info.remote() for w in self.workers])  # the engines are up
        first_request = None
        if roll_first_step:  # step 1 needs no sync (LoRA starts at zero: the base weights are the policy), only the engine
            served = [w.prompt_logprobs.remote(self.parity_ids) for w in self.workers]  # ahead of the rollout's calls
            self._ahead[1] = self._roll_ahead(1, None)
            self._on_policy.add(1)
            first_request = _process_age()
            self.learner = spawn_learners(cfg, self.model_path, self.placement, wait=False)
            self._start_probe = (self.learner.sequence_logprobs_ref(self.parity_ids), served)
        with timed("learner", phases):  # what was left of its build
            self.learner.ready()
        print("[rlvr] start-up: " + ", ".join(f"{k[5:-2]} {v:.1f}s" for k, v in phases.items())
              + (f"; first rollout request {first_request:.1f}s after launch" if first_request else ""), flush=True)
        self.nodes = self.placement.nodes()  # where each actor runs; every metrics record carries it
        print(f"[rlvr] actors on nodes {self.nodes}", flush=True)

    def _spawn_engines(self) -> None:
        self.model_path = resolve_model_path(self.cfg.model.path)
        self.placement = Placement(self.cfg, log_dir=self.run_dir / "logs")
        self.workers = spawn_rollout_workers(self.cfg, self.model_path, self.placement)

    def _wait_preflight(self) -> None:
        try:
            self.before_actors()
        except SystemExit:
            ray.shutdown()  # takes any engine already spawned with it; leave no Ray behind in the caller's process
            raise

    def _restore(self) -> int:
        """Load the latest checkpoint if any; returns the first step to run."""
        found = latest_checkpoint(self.run_dir)
        self.metrics = MetricsLog(self.run_dir, self.cfg.trainer.steps)
        self.tracker = Tracker(self.cfg.logging, self.run_dir)
        if found is None:
            self.metrics.truncate_after(0)  # records of a run killed before its first checkpoint
            dump_config(self.cfg, self.run_dir / "config.yaml")
            self._last_probe = (finish_parity_probe(self._start_probe, self.cfg.sync.parity_threshold,
                                                    "at start (base policy)") if self._start_probe
                                else self._probe("at start (base policy)"))
            return 1
        step, ckpt = found
        state = load_trainer_state(ckpt)
        random.setstate(_tuple_state(state["python_rng"]))
        self.learner.load_state(str(ckpt / "learner"))
        self.metrics.truncate_after(step)
        self.store.drop_after(step)
        print(f"[rlvr] resumed from {ckpt} (step {step}); continuing at step {step + 1}", flush=True)
        self.weight_sync.sync(self.learner, self.workers, step)
        self._last_probe = self._probe(f"after resume sync at step {step}")
        return step + 1

    def _probe(self, when: str) -> tuple[float, float]:
        return run_parity_probe(self.learner, self.workers, self.parity_ids, self.cfg.sync.parity_threshold, when)

    # ---- the loop ----------------------------------------------------------------
    def run(self) -> Path:
        self._start(roll_first_step=True)
        try:
            return self._run(self._restore())
        except Exception as e:
            lost = self._memory_kill(e) or self._node_death(e)
            if lost is None:
                raise
            raise ActorLost(lost) from e

    def _memory_kill(self, error: Exception) -> str | None:
        """What to say when Ray's memory monitor killed an actor of this run (which, its memory,
        the threshold, the resume command); None when it did not."""
        report = memory_kill_report(error, list(self.placement.names.values()))
        if report is None:
            return None
        found = latest_checkpoint(self.run_dir)
        return memory_killed_message(report, self._step, found[0] if found else None, self.run_dir)

    def _node_death(self, error: Exception) -> str | None:
        """What to say when a node with actors of this run died (their names, the resume
        command); None when none did. After an actor error, Ray may take a while to declare its
        node dead."""
        actor_error = any(isinstance(c, ray.exceptions.RayActorError) for c in causes(error))
        dead = self.placement.lost_nodes(wait_s=60.0 if actor_error else 0.0)
        if not dead:
            return None
        found = latest_checkpoint(self.run_dir)
        return node_died_message(dead, self._step, found[0] if found else None, self.run_dir, error)

    def _run(self, first: int) -> Path:
        done = read_metrics(self.run_dir)  # a resumed run judges its first step by the killed run's last
        last_step_s = float(done[-1].get("time_step_s", 0.0)) if done else 0.0
        for step in range(first, self.cfg.trainer.steps + 1):
            if self._out_of_time(step, last_step_s):
                return self.run_dir
            self._step = step
            started = time.time()
            metrics = self.step(step)
            metrics["time_step_s"] = time.time() - started
            self.metrics.log(step, metrics)
            self.tracker.log_step(step, metrics)
            self.console.step_done(step, metrics)
            if step % self.cfg.trainer.checkpoint_every == 0 or step == self.cfg.trainer.steps:
                save_checkpoint(self.run_dir, step, self.learner, {"python_rng": random.getstate()})
                if self.storage:
                    self.storage.push()
                plot_reward_curve(self.run_dir)
            last_step_s = metrics["time_step_s"]
        plot_reward_curve(self.run_dir)
        self.tracker.close()
        self.console.final_table(self.run_dir, read_metrics(self.run_dir))
        return self.run_dir

    def _out_of_time(self, step: int, last_step_s: float) -> bool:
        """The time limit would fall inside this step (judged by the last one's length, with a margin)."""
        if self.deadline is None or time.time() + 1.25 * last_step_s < self.deadline:
            return False
        found = latest_checkpoint(self.run_dir)
        done = f"after step {found[0]} (checkpointed)" if found else "before its first step"
        print(f"[rlvr] time limit: stopping {done}; continue with `rlvr train --resume {self.run_dir}`", flush=True)
        plot_reward_curve(self.run_dir)
        self.tracker.close()
        return True

    def step(self, step: int) -> dict:
        """One GRPO step, as named phases; each phase's wall time lands in the metrics."""
        timings: dict[str, float] = {}
        ahead = self._ahead.pop(step, None)
        if ahead is None:
            with timed("rollout", timings):
                sampled = self._collect(step)
        else:
            with timed("rollout_wait", timings):  # what the rollout cost beyond the previous step's learning
                sampled, timings["time_rollout_s"] = ahead.result()
        episodes = [e for g in sampled.groups.values() for e in g]
        self.tracker.log_episodes(step, episodes, self.tokenizer.decode)
        _refuse_all_failed(step, episodes)
        samples = self._to_samples(sampled.trained())
        if self.cfg.trainer.rollout_ahead and step < self.cfg.trainer.steps:
            # on the weights of the previous step's sync, which the thread waits for first
            self._ahead[step + 1] = self._roll_ahead(step + 1, self._issued)
        # while a rollout runs ahead, no worker call: a rollout worker serves one call at a time
        overlapped = step + 1 in self._ahead
        memory: dict = {}
        if not overlapped:  # the engine is idle (once an issued sync lands): it may sleep while the learner trains
            self._settle_issued(timings)
            memory["mem/awake_gib"] = self._device_memory()
            with timed("sleep", timings):
                ray.get([w.sleep.remote() for w in self.workers])
            memory["mem/asleep_gib"] = self._device_memory()
        with timed("learn", timings):
            learn = self._learn(step, samples)
        when = f"after {'sync' if learn else 'wake'} at step {step}"
        if overlapped:
            with timed("rollout_wait", timings):  # the engine must be idle before its weights change
                self._ahead[step + 1].exception()
            self._settle_issued(timings)  # the thread waited for it: this only reads its probe
            with timed("sync", timings):  # issued; the engines apply it while the next step learns
                self._issued = IssuedSync(self.weight_sync if learn else None, self.learner, self.workers, step,
                                          self.parity_ids, self.cfg.sync.parity_threshold, when)
        else:
            with timed("wake", timings):
                ray.get([w.wake.remote() for w in self.workers])
            memory["mem/woken_gib"] = self._device_memory()
            with timed("sync", timings):
                if learn:
                    self.weight_sync.sync(self.learner, self.workers, step)
            with timed("probe", timings):
                self._last_probe = self._probe(when)
        gap, gap_max = self._last_probe
        fresh = [e.record for gid, g in sampled.groups.items() if gid not in sampled.reused for e in g]
        gen_tokens = sum(r.tokens for r in fresh)
        return {**sampled.metrics(), **{f"learner/{k}": v for k, v in learn.items()},
                "loss": learn.get("loss"), "gen_tokens": gen_tokens,
                "gen_tokens_per_s": gen_tokens / max(timings["time_rollout_s"], 1e-9),
                "gen_tokens_mean": statistics.fmean(e.record.tokens for e in episodes),
                "policy_lag": int(ahead is not None and step not in self._on_policy),
                **timings, **step_time_budget(fresh, timings["time_rollout_s"], timings),
                **{k: v for k, v in memory.items() if v is not None},
                "parity_gap": gap, "parity_gap_max": gap_max, "train_samples": len(samples), "nodes": self.nodes,
                # every sampled episode, tying groups too: a step whose groups all tie still reports it
                "policy/entropy": sampled_entropy([s for e in episodes for s in e.sequences])}

    def _settle_issued(self, timings: dict[str, float]) -> None:
        """Wait for the sync issued last step (if any) and keep its probe; raises ParityError."""
        if self._issued is not None:
            gap, gap_max, waited = self._issued.wait()
            self._last_probe = (gap, gap_max)
            timings["time_sync_hidden_s"] = waited  # the engines' part of that sync, beside this step's update
            self._issued = None

    def _roll_ahead(self, step: int, issued: IssuedSync | None) -> Future:
        """The step's rollouts in a daemon thread, after the issued sync (if any) has landed:
        (StepGroups, wall seconds). A failure surfaces when the step takes them; a run that dies
        meanwhile does not wait for the thread."""
        future: Future = Future()

        def work() -> None:
            try:
                if issued is not None:
                    issued.wait()
                t0 = time.time()
                future.set_result((self._collect(step), time.time() - t0))
            except BaseException as e:  # handed to the step that takes the result
                future.set_exception(e)

        threading.Thread(target=work, name=f"rollout-step-{step}", daemon=True).start()
        return future

    def _device_memory(self) -> float | None:
        """GiB in use on the first rollout worker's GPU (engine + co-located learner); None on CPU."""
        return ray.get(self.workers[0].device_memory_gib.remote())

    def _learn(self, step: int, samples: list[TrainSample]) -> dict:
        """One learner update on the samples that carry a learning signal; {} when none does."""
        if any(any(s.loss_mask) for s in samples):
            return self.learner.train_step(samples)
        print(f"[rlvr] step {step}: no sample with a learning signal (every group's rewards were equal); "
              f"update skipped", flush=True)
        return {}

    def _collect(self, step: int) -> StepGroups:
        """This step's groups (dynamic sampling replaces tying ones), under a progress bar that
        starts at the episodes a killed run already finished (reused, not rolled out again)."""
        total = self.cfg.trainer.batch_size * self.cfg.trainer.group_size
        done = self.store.load_groups(step)
        reused = sum(len(g) for g in done.values())
        with self.console.progress(step, max(total, reused), done=reused) as bar:
            return collect_step(step, self.rollouts, self.store, self.cfg, on_episode_done=bar, done=done)

    def _to_samples(self, episodes: list[Episode]) -> list[TrainSample]:
        """Advantages and training samples from the kept groups' episodes (training rewards)."""
        advantages = group_advantages([e.reward for e in episodes], [e.group_id for e in episodes])
        samples = [TrainSample(s.token_ids, s.loss_mask, s.logprobs, advantage=a, group_id=e.group_id)
                   for e, a in zip(episodes, advantages) for s in e.sequences]
        if self.cfg.learner.beta == 0:  # zero advantage, no KL term: exactly zero gradient
            samples = [s for s in samples if s.advantage != 0]
        return samples


def _refuse_all_failed(step: int, episodes: list[Episode]) -> None:
    if all(e.record.stop_reason == "error" for e in episodes):
        first = episodes[0].record
        raise RuntimeError(f"every rollout of step {step} failed; the first: {first.error or first.reward_error}")


def _tuple_state(state):
    """JSON turns the RNG state's tuples into lists; random.setstate wants tuples back."""
    return tuple(_tuple_state(s) if isinstance(s, list) else s for s in state)


def _process_age() -> float | None:
    """Seconds since this process started (Linux /proc), for the start-up line; None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


def _model_folder_exists(path: str) -> bool:
    """model.path names a folder that is already there (a built-in model once built)."""
    return (model_dir(path) / "config.json").is_file()
