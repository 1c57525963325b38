"""Agentic GRPO on real parts: the native scaffold talks to the recording policy server,
tools run in the sandbox on an EnvActor, and the learner agrees with what was recorded."""
import json
import statistics
from pathlib import Path

import pytest
import ray

from orchestrator.metrics import read_metrics
from rl.assembly import assemble
from rl.config import load_config

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "configs" / "tasks" / "toolz.jsonl"


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


def test_multi_turn_episode_logprobs_match_the_learner(cluster, model_path):
    from envs.tasks import load_tasks
    from orchestrator.cluster import spawn_env_actors, spawn_learners, spawn_rollout_workers
    from scaffolds.native import run_native_episode

    cfg = load_config(REPO / "configs" / "default.yaml",
                      ["rollout.max_tokens=96", "scaffold.max_turns=3", "rollout.tool_choice=required"])
    [worker] = spawn_rollout_workers(cfg, model_path, enable_lora=True, count=1)
    [env] = spawn_env_actors(cfg)
    learner = spawn_learners(cfg, model_path)
    base = ray.get(worker.start_server.remote())
    task = load_tasks(TASKS)[0]
    eid = ray.get(env.open_episode.remote(task))
    cwd = ray.get(env.sandbox_cwd.remote(eid))
    outcome = run_native_episode(f"{base}/episodes/ep-1/v1", "policy", env, eid, task.problem_statement, cwd,
                                 cfg.scaffold)
    reward = ray.get(env.finish.remote(eid))
    calls = ray.get(worker.take_episode_calls.remote("ep-1"))
    assert outcome.turns == len(calls) >= 2, outcome
    assert outcome.tool_calls >= 1 and reward.reward >= 0
    asm = assemble(calls)
    assert asm.merged_calls + asm.split_calls == len(calls) - 1
    print(f"calls={len(calls)} merged={asm.merged_calls} split={asm.split_calls} outcome={outcome}")
    gaps = []
    for sample in asm.samples:
        learner_lp = learner.sequence_logprobs(sample.token_ids)
        gaps += [abs(a - b) for a, b, m in zip(learner_lp, sample.logprobs, sample.loss_mask) if m]
    print(f"recorded vs learner log-probs over {len(gaps)} tokens: mean {statistics.fmean(gaps):.2e} max {max(gaps):.2e}")
    assert statistics.fmean(gaps) < 1e-3 and max(gaps) < 5e-2


@pytest.mark.heavy
def test_main_job_runs_agentic_steps_and_traces_every_rollout(tmp_path, model_path):
    from orchestrator.loop import Trainer
    ray.shutdown()
    run_dir = tmp_path / "run"
    cfg = load_config(REPO / "configs" / "default.yaml",
                      [f"trainer.run_dir={run_dir}", "trainer.steps=2", "trainer.batch_size=1",
                       "trainer.group_size=2", "scaffold.max_turns=2", "rollout.max_tokens=64"])
    try:
        Trainer(cfg).run()
    finally:
        ray.shutdown()
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    for key in ("reward_std", "frac_reward_zero_std", "clipped_ratio", "tools/failure_frequency"):
        assert key in metrics[0]
    trace = [json.loads(l) for l in (run_dir / "trace.jsonl").read_text().splitlines()]
    assert len(trace) == 4
    for rec in trace:
        assert {"task", "reward", "reward_parts", "turns", "tool_calls", "tool_failures", "edited", "clipped",
                "tokens", "seconds"} <= rec.keys()
    assert (run_dir / "reward_curve.png").is_file()
