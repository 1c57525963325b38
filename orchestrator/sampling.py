"""Which groups a step trains on: the step's fixed draws, plus -- with dynamic sampling --
fresh groups of other tasks in place of groups whose rewards all tie (DAPO).

A tying group has zero advantage everywhere, so with beta = 0 it adds no gradient; a step
made of such groups is wasted compute. Dynamic sampling draws replacement groups until the
step holds `trainer.batch_size` groups with reward variance, or `max_extra_groups` extra
groups have been sampled. Every sampled group is stored as it finishes (EpisodeStore), and
which extra group comes next depends only on (seed, step, j), so a resumed step replays the
same decisions from the stored rewards and rolls out only what is missing.

Rewards seen here are training rewards: the verifier's reward shaped by task.reward_mode,
with episodes that ended in a way listed in trainer.sampling.mask_episodes left out of their group.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from orchestrator.episode_store import EpisodeStore
from orchestrator.rescue import prefix_calls_now
from orchestrator.rollouts.base import Episode, GroupSpec, Rollouts
from rl.advantages import group_ties, shape_reward
from rl.config import RunConfig

# trainer.sampling.mask_episodes names -> the scaffold stop reasons they cover
MASKED_STOPS = {"truncated": {"length", "token_budget"}, "wall_clock": {"wall_clock"}, "max_turns": {"max_turns"}}


def masked(episode: Episode, kinds: list[str]) -> bool:
    """The episode ended by an environment limit listed in trainer.sampling.mask_episodes."""
    stop = episode.record.stop_reason
    return any(stop in MASKED_STOPS[k] for k in kinds)


def training_group(episodes: list[Episode], cfg: RunConfig) -> list[Episode]:
    """The group as training sees it: masked episodes out, rewards shaped by task.reward_mode."""
    kept = [e for e in episodes if not masked(e, cfg.trainer.sampling.mask_episodes)]
    return [Episode(e.group_id, shape_reward(e.reward, cfg.task.reward_mode), e.sequences, e.record) for e in kept]


def ties(group: list[Episode], tol: float) -> bool:
    """No learning signal: fewer than two episodes left, or rewards within tol of each other."""
    return len(group) < 2 or group_ties([e.reward for e in group], tol)


def extra_group_specs(step: int, seed: int, names: list[str], taken: set[str], count: int) -> list[GroupSpec]:
    """The first `count` replacement groups of a step, a pure function of (seed, step, names, taken):
    tasks not yet in the step first (shuffled), then any task again."""
    rng = random.Random(seed * 1_000_003 + step * 7_919 + 17)
    fresh = [i for i in range(len(names)) if names[i] not in taken]
    rng.shuffle(fresh)
    order = list(fresh)
    while len(order) < count and names:
        again = list(range(len(names)))
        rng.shuffle(again)
        order += again
    return [GroupSpec(f"s{step}-x{j}-{names[i]}", i) for j, i in enumerate(order[:count])]


@dataclass
class StepGroups:
    """Every group a step sampled (in sampling order), as training sees them."""
    groups: dict[str, list[Episode]]        # raw episodes, as stored
    train: dict[str, list[Episode]]         # training view (masked out, shaped rewards)
    base: list[str]                         # the step's fixed draws
    kept: list[str]                         # the groups that train
    tol: float = 0.0                        # reward spread at or below which a group ties
    reused: set[str] = field(default_factory=set)  # finished by a killed run, not rolled out now
    rescued: set[str] = field(default_factory=set)  # started from a demonstration's first calls

    def trained(self) -> list[Episode]:
        """The kept groups' episodes, as training sees them: what the update learns from."""
        return [e for g in self.kept for e in self.train[g]]

    def metrics(self) -> dict:
        """The step's sampling decisions, and the reward and behaviour of every episode it sampled
        (training rewards, masked episodes out)."""
        return {**self._sampling_metrics(), **episode_stats([e for g in self.train.values() for e in g])}

    def _sampling_metrics(self) -> dict:
        sampled = list(self.groups)
        tied = [g for g in sampled if ties(self.train[g], self.tol)]
        base_eps = [e for g in self.base for e in self.groups[g]]
        return {
            "sampling/groups_sampled": len(sampled),
            "sampling/groups_kept": len(self.kept),
            "sampling/extra_groups": len(sampled) - len(self.base) - len(self.rescued),
            "sampling/rescued_groups": len(self.rescued),
            "sampling/rescued_kept": len(self.rescued & set(self.kept)),
            "sampling/episodes_masked": sum(len(self.groups[g]) - len(self.train[g]) for g in sampled),
            "frac_reward_zero_std": len(tied) / len(sampled) if sampled else 0.0,
            "band/reward_mean": statistics.fmean(e.reward for e in base_eps) if base_eps else 0.0,
            "band/pass_rate": statistics.fmean(float(e.reward >= 1.0) for e in base_eps) if base_eps else 0.0,
        }


def collect_step(step: int, rollouts: Rollouts, store: EpisodeStore, cfg: RunConfig,
                 on_episode_done=None, done: dict[str, list[Episode]] | None = None) -> StepGroups:
    """Roll out (or reuse) the step's groups; with dynamic sampling, replace tying ones.
    on_episode_done (a progress bar) sees every episode rolled out now as it ends; done: the
    step's finished groups when the caller has already read them from the store."""
    ds, names = cfg.trainer.sampling.dynamic, rollouts.names
    done = store.load_groups(step) if done is None else done
    reused = set(done)
    if done:
        print(f"[rlvr] step {step}: reusing {len(done)} finished group(s)", flush=True)

    def on_group_done(episodes: list[Episode]) -> None:
        store.append_group(step, episodes)
        done[episodes[0].group_id] = episodes

    def run(specs: list[GroupSpec]) -> None:
        missing = [s for s in specs if s.group_id not in done]
        if missing:
            rollouts.run_groups(missing, step, on_group_done, on_episode_done)

    order: list[str] = []
    train: dict[str, list[Episode]] = {}

    def add(specs: list[GroupSpec]) -> None:
        run(specs)
        for s in specs:
            order.append(s.group_id)
            train[s.group_id] = training_group(done[s.group_id], cfg)

    base = rollouts.group_specs(step)
    add(base)
    rescued = rescue_specs(step, [s for s in base if all_failed(train[s.group_id])], rollouts, store, cfg)
    if rescued:
        print(f"[rlvr] step {step}: every episode of {len(rescued)} group(s) failed; rescuing from "
              f"{', '.join(str(s.prefix_calls) for s in rescued)} demonstration call(s)", flush=True)
        add(rescued)
    if ds.enabled:
        extras = extra_group_specs(step, cfg.trainer.seed, names, {names[s.index] for s in base}, ds.max_extra_groups)
        used = 0
        while used < len(extras):
            need = cfg.trainer.batch_size - sum(not ties(train[g], ds.tie_tolerance) for g in order)
            if need <= 0:
                break
            batch = extras[used:used + need]
            used += len(batch)
            print(f"[rlvr] step {step}: {need} group(s) short of variance; sampling {len(batch)} more "
                  f"({used}/{len(extras)} extra)", flush=True)
            add(batch)
        kept = [g for g in order if not ties(train[g], ds.tie_tolerance)][:cfg.trainer.batch_size]
    else:
        kept = list(order)
    return StepGroups({g: done[g] for g in order}, train, [s.group_id for s in base], kept, ds.tie_tolerance,
                      reused & set(order), {s.group_id for s in rescued})


def all_failed(group: list[Episode]) -> bool:
    return bool(group) and all(e.reward <= 0 for e in group)


def rescue_specs(step: int, failed: list[GroupSpec], rollouts: Rollouts, store: EpisodeStore,
                 cfg: RunConfig) -> list[GroupSpec]:
    """Rescue groups for the step's all-fail groups (trainer.rescue): the same task from the
    first k calls of its demonstration, k by the pass rates of that task's earlier rescued
    groups (orchestrator/rescue.py), read from the store's group index."""
    rc = cfg.trainer.rescue
    if not rc.enabled or not failed:
        return []
    history: dict[str, list[float]] = {}
    for g in store.summaries_before(step):
        if g.prefix_calls:
            history.setdefault(g.task, []).append(g.pass_rate)
    specs = []
    for s in failed:
        k = prefix_calls_now(rollouts.rescue_calls(s.index), history.get(rollouts.names[s.index], []), rc.shrink_at)
        if k > 0 and len(specs) < rc.max_groups:
            specs.append(GroupSpec(f"{s.group_id}-rescue{k}", s.index, prefix_calls=k))
    return specs


def episode_stats(episodes: list[Episode]) -> dict:
    """Reward and behaviour of a step's episodes."""
    if not episodes:
        return {}
    rewards = [e.reward for e in episodes]
    records = [e.record for e in episodes]
    stats = {"reward_mean": statistics.fmean(rewards), "reward_std": statistics.pstdev(rewards),
             "clipped_ratio": statistics.fmean(float(r.clipped) for r in records)}
    agentic = [r for r in records if r.agentic]
    if agentic:
        calls = sum(r.tool_calls for r in agentic)
        stats["tools/failure_frequency"] = sum(r.tool_failures for r in agentic) / max(calls, 1)
        stats["frac_edited"] = statistics.fmean(float(bool(r.edited)) for r in agentic)
        stats["turns_mean"] = statistics.fmean(r.turns for r in agentic)
        stats["reward/flagged_episodes"] = sum(bool(r.reward_flags) for r in agentic)
        stats["tools/unparsed_calls"] = sum(r.unparsed_tool_calls or 0 for r in agentic)
    return stats
