"""One episode runner for training and evaluation: a training group (AgenticRollouts) and an
evaluation (Evaluator) run on the real sandbox, served by the real small model, and their
stored records carry the same episode fields, all filled in."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import ray

from envs.split import select_tasks
from orchestrator.cluster import spawn_rollout_workers
from orchestrator.evaluator import Evaluator
from orchestrator.rollouts.agentic import AgenticRollouts
from rl.config import load_config
from rl.types import EpisodeRecord

REPO = Path(__file__).resolve().parent.parent
EPISODE_FIELDS = {f.name for f in fields(EpisodeRecord)}
ALWAYS_SET = EPISODE_FIELDS - {"error", "reward_error", "events"}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()


def test_training_and_evaluation_records_come_from_one_runner(cluster, model_path, tmp_path):
    cfg = load_config(REPO / "configs" / "default.yaml", [
        f"trainer.run_dir={tmp_path / 'run'}", "trainer.batch_size=1", "trainer.group_size=2", "task.max_tasks=10",
        "scaffold.name=native", "eval.scaffold=native", "eval.k=1", "scaffold.max_turns=2", "rollout.max_tokens=64",
        "rollout.tool_choice=required", "env.pool_size=2", "env.sandbox_uid_base=64700",
        "env.work_root=/tmp/agentic-rlvr-test-runner"])
    run_dir, out = tmp_path / "run", tmp_path / "eval"
    [worker] = spawn_rollout_workers(cfg, model_path, count=1)
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
    assert [EpisodeRecord.from_dict(r) for r in trace] == [e.record for e in episodes]
    ray.get([a.shutdown.remote() for a in rollouts.env_actors])
    ray.get(worker.shutdown.remote())
