"""The real pi CLI against the real served small model on CPU, inside a real sandbox on a real
mined toolz task: the episode runs, its tool calls execute in the sandbox, and the policy
server records every call with token ids and log-probs. The 135M model mostly fails the task;
this asserts the machinery, not the score."""
from __future__ import annotations

import json
import math

import pytest

from rl.config import RunConfig
from scaffolds.pi.episode import run_pi_episode_on_actor
from scaffolds.pi.install import pi_cli_path
from tests.fixtures.env import env_cfg, toolz_tasks

pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not pi_cli_path().exists(), reason="pi not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module")
def stack(model_path):
    import ray

    from orchestrator.cluster import connect, spawn_env_actors, spawn_rollout_workers

    cfg = RunConfig.model_validate({
        "rollout": {"max_model_len": 4096, "max_tokens": 192, "tool_choice": "required",
                    "tool_strict_level": "parameter", "temperature": 0.7},
        "scaffold": {"name": "pi", "max_turns": 2, "wall_clock_s": 240},
        "env": env_cfg(sandbox_uid_base=64300).model_dump(),
        "ray": {"address": None}})
    connect(cfg)
    [worker] = spawn_rollout_workers(cfg, model_path, enable_lora=False, count=1)
    base = ray.get(worker.start_server.remote())
    [env_actor] = spawn_env_actors(cfg)
    yield cfg, worker, base, env_actor
    ray.get(env_actor.shutdown.remote())
    ray.get(worker.shutdown.remote())
    ray.shutdown()


def test_real_pi_episode_records_tokens_and_logprobs(stack, tmp_path):
    import ray

    cfg, worker, base, env_actor = stack
    task = toolz_tasks()[0]
    episode_id = "pi-real-1"
    env_episode = ray.get(env_actor.open_episode.remote(task))
    events = tmp_path / "events.jsonl"
    try:
        outcome = run_pi_episode_on_actor(
            env_actor, env_episode, task.problem_statement, f"{base}/episodes/{episode_id}/v1", "policy",
            cfg.scaffold, context_window=cfg.rollout.max_model_len, max_tokens=cfg.rollout.max_tokens,
            events_path=str(events))
    finally:
        reward = ray.get(env_actor.finish.remote(env_episode))
    calls = ray.get(worker.take_episode_calls.remote(episode_id))
    print(outcome, reward, len(calls))

    assert outcome.stop_reason in ("stop", "length", "max_turns", "error"), outcome
    assert outcome.turns >= 1 and outcome.seconds < cfg.scaffold.wall_clock_s
    # tool_choice=required: every turn is a tool call, and pi executed them inside the sandbox
    assert outcome.tool_calls >= 1, outcome
    executed = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(e["type"] == "tool_execution_end" for e in executed)
    assert 0.0 <= reward.reward <= 1.0

    assert outcome.turns <= cfg.scaffold.max_turns
    assert len(calls) >= outcome.turns >= 1
    for c in calls:
        assert c.prompt_token_ids and c.completion_token_ids
        assert len(c.logprobs) == len(c.completion_token_ids)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in c.logprobs)
    # pi ran with the checkout as its cwd inside the sandbox (/repo exists only there)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(worker_model_path(worker))
    first_prompt = tok.decode(calls[0].prompt_token_ids)
    assert "Current working directory: /repo" in first_prompt
    assert task.problem_statement[:60] in first_prompt


def worker_model_path(worker) -> str:
    import ray
    return ray.get(worker.chat_template_info.remote())["tokenizer"]
