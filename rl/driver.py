"""The step loop: roll out, score, learn, sync, probe, log, checkpoint.

Nothing here holds state that a checkpoint does not: a run directory plus its config is
enough to resume. One step, as data (DESIGN.md): groups of episodes from the rollout
workers -> group-relative advantages -> one learner update -> weight sync -> parity probe.
"""
from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import ray

from actors.weight_sync import WeightSync, make_weight_sync
from rl.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from rl.config import RunConfig, dump_config
from rl.default_model import resolve_model_path
from rl.episode_store import Episode, EpisodeStore
from rl.grpo import frac_zero_std_groups, group_advantages
from rl.metrics import MetricsLog
from rl.parity import run_parity_probe
from rl.plots import plot_reward_curve
from rl.ray_setup import Placement, connect
from rl.types import TrainSample


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, weight_sync: WeightSync | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir or cfg.trainer.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.weight_sync = weight_sync or make_weight_sync(cfg.sync.strategy, self.run_dir)
        self.store = EpisodeStore(self.run_dir)

    # ---- set-up ------------------------------------------------------------------
    def _start(self) -> None:
        from transformers import AutoTokenizer

        from actors.learner import Learner
        from actors.rollout_worker import RolloutWorker

        cfg = self.cfg
        connect(cfg)
        self.model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.placement = Placement(cfg)
        print(f"[rlvr] run dir {self.run_dir}; model {self.model_path}; "
              f"{cfg.rollout.num_workers} rollout worker(s), {cfg.learner.num_learners} learner(s)", flush=True)
        enable_lora = cfg.sync.strategy == "lora"
        self.workers = [
            ray.remote(RolloutWorker).options(**self.placement.options("rollout", i, cfg, threads=max(1, int(cfg.rollout.num_cpus))))
            .remote(self.model_path, cfg.rollout, cfg.model, enable_lora, cfg.learner.lora_rank)
            for i in range(cfg.rollout.num_workers)]
        if cfg.learner.num_learners > 1:
            from actors.learner_group import LearnerGroup
            self.learner = LearnerGroup(cfg, self.model_path, self.placement)
        else:
            self.learner = ray.remote(Learner).options(**self.placement.options("learner", 0, cfg, threads=cfg.learner.torch_threads)) \
                .remote(self.model_path, cfg.learner, cfg.model, cfg.trainer.seed)
        self.rollouts = self._make_rollouts()
        self.parity_ids = self.tokenizer(cfg.sync.parity_text)["input_ids"]

    def _make_rollouts(self):
        if self.cfg.task.kind == "length":
            from rl.length_rollouts import LengthRollouts
            return LengthRollouts(self.cfg, self.tokenizer, self.workers)
        from rl.agentic_rollouts import AgenticRollouts
        return AgenticRollouts(self.cfg, self.run_dir, self.workers, self.placement)

    def _restore(self) -> int:
        """Load the latest checkpoint if any; returns the first step to run."""
        found = latest_checkpoint(self.run_dir)
        self.metrics = MetricsLog(self.run_dir, self.cfg.trainer.steps)
        if found is None:
            dump_config(self.cfg, self.run_dir / "config.yaml")
            self._probe("at start (base policy)")
            return 1
        step, ckpt = found
        state = load_trainer_state(ckpt)
        random.setstate(_tuple_state(state["python_rng"]))
        ray.get(self.learner.load_state.remote(str(ckpt / "learner")))
        self.metrics.truncate_after(step)
        self.store.drop_after(step)
        print(f"[rlvr] resumed from {ckpt} (step {step}); continuing at step {step + 1}", flush=True)
        self.weight_sync.sync(self.learner, self.workers, step)
        self._probe(f"after resume sync at step {step}")
        return step + 1

    def _probe(self, when: str) -> float:
        return run_parity_probe(self.learner, self.workers, self.parity_ids, self.cfg.sync.parity_threshold, when)

    # ---- the loop ----------------------------------------------------------------
    def run(self) -> Path:
        self._start()
        first = self._restore()
        for step in range(first, self.cfg.trainer.steps + 1):
            metrics = self.step(step)
            self.metrics.log(step, metrics)
            if step % self.cfg.trainer.checkpoint_every == 0 or step == self.cfg.trainer.steps:
                save_checkpoint(self.run_dir, step, self.learner,
                                {"python_rng": random.getstate(), "data_cursor": step * self.cfg.trainer.batch_size})
                plot_reward_curve(self.run_dir)
        plot_reward_curve(self.run_dir)
        print(f"[rlvr] done: {self.run_dir / 'metrics.jsonl'}, {self.run_dir / 'reward_curve.png'}", flush=True)
        return self.run_dir

    def step(self, step: int) -> dict:
        t0 = time.time()
        groups, reused = self._collect(step)
        t_rollout = time.time() - t0
        samples, stats = self._to_samples(groups)
        episodes = [e for g in groups.values() for e in g]
        if all(e.record.get("stop_reason") == "error" for e in episodes):
            raise RuntimeError(f"every rollout of step {step} failed; the first: {episodes[0].record.get('error')}")

        if self.cfg.learner.beta == 0:  # zero advantage, no KL term: exactly zero gradient
            samples = [s for s in samples if s.advantage != 0]
        ray.get([w.sleep.remote() for w in self.workers])
        t1 = time.time()
        if any(any(s.loss_mask) for s in samples):
            learn = ray.get(self.learner.train_step.remote(samples))
        else:
            print(f"[rlvr] step {step}: no sample with a learning signal (every group's rewards were equal); "
                  f"update skipped", flush=True)
            learn = {}
        t_learn = time.time() - t1

        t2 = time.time()
        ray.get([w.wake.remote() for w in self.workers])
        if learn:
            self.weight_sync.sync(self.learner, self.workers, step)
        t_sync = time.time() - t2
        gap = self._probe(f"after {'sync' if learn else 'wake'} at step {step}")
        gen_tokens = sum(e.record.get("tokens", 0) for gid, g in groups.items() if gid not in reused for e in g)
        return {**stats, **{f"learner/{k}": v for k, v in learn.items()}, "loss": learn.get("loss"),
                "gen_tokens": gen_tokens, "gen_tokens_per_s": gen_tokens / max(t_rollout, 1e-9),
                "time_rollout_s": t_rollout, "time_learn_s": t_learn, "time_sync_s": t_sync,
                "parity_gap": gap, "train_samples": len(samples)}

    def _collect(self, step: int) -> tuple[dict[str, list[Episode]], set[str]]:
        """Groups of this step: the ones a killed run already finished (also returned as a
        set of ids), plus the rest, rolled out now."""
        specs = self.rollouts.group_specs(step)
        done = self.store.load_groups(step)
        reused = set(done)
        missing = [s for s in specs if s[0] not in done]
        if done:
            print(f"[rlvr] step {step}: reusing {len(done)} finished group(s), rolling out {len(missing)}", flush=True)

        def on_group_done(episodes: list[Episode]) -> None:
            self.store.append_group(step, episodes)
            done[episodes[0].group_id] = episodes

        if missing:
            self.rollouts.run_groups(missing, step, on_group_done)
        return {gid: done[gid] for gid, _ in specs}, reused

    def _to_samples(self, groups: dict[str, list[Episode]]) -> tuple[list[TrainSample], dict]:
        episodes = [e for g in groups.values() for e in g]
        rewards = [e.reward for e in episodes]
        gids = [e.group_id for e in episodes]
        advantages = group_advantages(rewards, gids)
        samples = [TrainSample(advantage=a, group_id=e.group_id, **s)
                   for e, a in zip(episodes, advantages) for s in e.samples]
        records = [e.record for e in episodes]
        stats = {"reward_mean": statistics.fmean(rewards),
                 "reward_std": statistics.pstdev(rewards),
                 "frac_reward_zero_std": frac_zero_std_groups(rewards, gids),
                 "clipped_ratio": statistics.fmean(float(r.get("clipped", False)) for r in records)}
        if any("tool_calls" in r for r in records):
            calls = sum(r.get("tool_calls", 0) for r in records)
            stats["tools/failure_frequency"] = sum(r.get("tool_failures", 0) for r in records) / max(calls, 1)
            stats["frac_edited"] = statistics.fmean(float(r.get("edited", False)) for r in records)
            stats["turns_mean"] = statistics.fmean(r.get("turns", 0) for r in records)
        return samples, stats


def _tuple_state(state):
    """JSON turns the RNG state's tuples into lists; random.setstate wants tuples back."""
    return tuple(_tuple_state(s) if isinstance(s, list) else s for s in state)
