"""The episode runner: the one place an episode is run and recorded, for training,
evaluation and every later consumer.

    open the task's environment -> run the scaffold (pi or native) against the policy
    server -> reward (always, even when the scaffold failed) -> take the server's recorded
    calls -> one EpisodeRecord plus the token sequences assembled from those calls.

Example:
    run = run_episode(env_actor, worker, task, "s1-g0-e0", base_url,
                      EpisodeSettings.for_training(cfg))
    run.record.reward, run.record.turns, run.sequences[0].loss_mask
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import ray

from envs.tasks import Task
from rl.assembly import assemble
from rl.config import SERVED_MODEL, RunConfig, ScaffoldConfig
from rl.types import EPISODE_TIME_PARTS, CallRecord, Completion, EpisodeRecord, Prefix, TokenSequence
from scaffolds.base import Scaffold, ScaffoldInputs
from scaffolds.native import NativeScaffold
from scaffolds.pi.episode import PiScaffold

SCAFFOLDS: dict[str, Scaffold] = {s.name: s for s in (NativeScaffold(), PiScaffold())}  # by config name


def scaffold_named(name: str) -> Scaffold:
    try:
        return SCAFFOLDS[name]
    except KeyError:
        raise ValueError(f"unknown scaffold {name!r}; known: {', '.join(sorted(SCAFFOLDS))}") from None


def safe_id(text: str) -> str:
    """Ids travel in the policy server's URL path and in file names: task ids hold '/' and ':'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:160]


def episode_url(base_url: str, episode_id: str) -> str:
    """The OpenAI base URL under which the policy server records this episode's calls."""
    return f"{base_url}/episodes/{episode_id}/v1"


@dataclass(frozen=True)
class EpisodeSettings:
    """How a run's episodes are run (the scaffold by name, its limits, the served model): the
    per-run part of a scaffold's inputs, which `run_episode` fills in per episode."""
    scaffold: str                  # "pi" | "native"
    scaffold_cfg: ScaffoldConfig
    context_window: int            # rollout.max_model_len
    max_tokens: int                # rollout.max_tokens, per model call
    model_id: str = SERVED_MODEL

    @classmethod
    def for_training(cls, cfg: RunConfig) -> "EpisodeSettings":
        return cls(cfg.scaffold.name, cfg.scaffold, cfg.rollout.max_model_len, cfg.rollout.max_tokens)

    @classmethod
    def for_eval(cls, cfg: RunConfig) -> "EpisodeSettings":
        return cls(cfg.eval.scaffold, cfg.scaffold, cfg.rollout.max_model_len, cfg.rollout.max_tokens,
                   cfg.eval.model_id)


@dataclass
class EpisodeRun:
    """What `run_episode` returns: the episode's record plus its token sequences to train on."""
    record: EpisodeRecord
    sequences: list[TokenSequence]   # the recorded calls, assembled for training


def single_turn_episode(completion: Completion, reward: float) -> EpisodeRun:
    """A one-call episode without an environment (the length reward's): the prompt is
    masked, the completion trained; no agentic fields."""
    n_prompt = len(completion.prompt_token_ids)
    sequence = TokenSequence(token_ids=completion.prompt_token_ids + completion.token_ids,
                             loss_mask=[0] * n_prompt + [1] * len(completion.token_ids),
                             logprobs=[0.0] * n_prompt + list(completion.logprobs))
    record = EpisodeRecord(reward=reward, tokens=len(completion.token_ids),
                           clipped=completion.finish_reason == "length")
    return EpisodeRun(record, [sequence])


def run_episode(env_actor, worker, task: Task, episode_id: str, base_url: str, settings: EpisodeSettings,
                events_path: Path | None = None, prefix: Prefix | None = None) -> EpisodeRun:
    """Run one episode on env_actor against the policy served at base_url (by worker).

    worker: the RolloutWorker handle behind base_url, whose recorded calls for episode_id
    are taken (so the server does not keep them); None when the server is not ours.
    prefix: a rescue's first calls, which the server answers from a demonstration.
    """
    url = episode_url(base_url, episode_id)
    start = time.monotonic()
    if prefix is not None:
        if worker is None:
            raise ValueError("a rescue prefix needs the project's own policy server")
        ray.get(worker.script_episode.remote(episode_id, prefix.messages))
    env_episode = ray.get(env_actor.open_episode.remote(task))
    try:
        outcome = scaffold_named(settings.scaffold).run(ScaffoldInputs(
            env_actor, env_episode, task.problem_statement, url, settings.model_id, settings.scaffold_cfg,
            settings.context_window, settings.max_tokens, str(events_path) if events_path else None))
    finally:
        reward_start = time.monotonic()
        reward = ray.get(env_actor.finish.remote(env_episode))
        reward_s = time.monotonic() - reward_start
    calls = ray.get(worker.take_episode_calls.remote(episode_id)) if worker is not None else []
    budget = time_budget(calls, outcome.seconds, reward_s, time.monotonic() - start)
    asm = assemble(calls)
    record = EpisodeRecord(
        reward=reward.reward, tokens=sum(len(c.completion_token_ids) for c in calls if not c.scripted),
        clipped=any(c.finish_reason == "length" for c in calls), task=task.id, episode=episode_id,
        reward_parts=reward.parts, edited=reward.edited, tests_passed=reward.tests_passed,
        tests_total=reward.tests_total, turns=outcome.turns, tool_calls=outcome.tool_calls,
        tool_failures=outcome.tool_failures, edits=outcome.edits, edit_failures=outcome.edit_failures,
        unparsed_tool_calls=sum(c.unparsed_tool_call for c in calls),
        stop_reason=outcome.stop_reason, error=outcome.error,
        reward_error=reward.error, reward_flags=list(reward.flags), calls=len(calls),
        merged_calls=asm.merged_calls, split_calls=asm.split_calls,
        seconds=outcome.seconds, reward_seconds=reward.seconds, time_budget=budget,
        prompt_tokens=sum(len(c.prompt_token_ids) for c in calls), cached_tokens=sum(c.cached_tokens for c in calls),
        events=str(events_path) if events_path is not None and events_path.exists() else None,
        prefix_calls=len(prefix.messages) if prefix else None, prefix_source=prefix.source if prefix else None,
        host_load=os.getloadavg()[0] / (os.cpu_count() or 1))
    return EpisodeRun(record, asm.samples)


def time_budget(calls: list[CallRecord], scaffold_s: float, reward_s: float, total_s: float) -> dict[str, float]:
    """An episode's wall time by part (rl.types.EPISODE_TIME_PARTS); the parts add up to total_s.

    Model calls split into the engine's queue/prefill/decode/rescore and the server's own
    rest; the scaffold's time outside model calls is tool execution; what the episode
    spent outside the scaffold and the reward is the environment's (checkout, transfers).
    """
    parts = dict.fromkeys(EPISODE_TIME_PARTS, 0.0)
    for c in calls:
        engine = c.queue_s + c.prefill_s + c.decode_s + c.rescore_s
        parts["queue"] += c.queue_s
        parts["prefill"] += c.prefill_s
        parts["decode"] += c.decode_s
        parts["rescore"] += c.rescore_s
        parts["server"] += max(0.0, c.seconds - engine)
    calls_s = sum(c.seconds for c in calls)
    parts["tools"] = max(0.0, scaffold_s - calls_s)
    parts["reward"] = reward_s
    parts["env"] = max(0.0, total_s - max(scaffold_s, calls_s) - reward_s)
    return {k: round(v, 4) for k, v in parts.items()}
