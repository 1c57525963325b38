"""The warm-start end to end on the real stack (heavy: ~15-25 min on 2 cores): verified
demonstrations of three training tasks -> TRL SFTTrainer (LoRA, merged) -> the merged folder
served by the engine -> pi episodes on those tasks. The base model never edits (it answers
in prose); after the warm-start most episodes edit the file. The parity probe must hold on
the merged folder (engine and learner load the same weights)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.heavy

EVAL = ["eval.k=2", "scaffold.max_turns=8", "scaffold.wall_clock_s=300", "rollout.max_tokens=768",
        "rollout.max_model_len=8192", "rollout.tool_choice=client", "rollout.tool_strict_level=auto",
        "model.dtype=bfloat16"]


def edited_fraction(cfg, model_path, tasks, out) -> float:
    import ray

    from orchestrator.cluster import spawn_env_actors, spawn_evaluator, start_policy
    cfg = cfg.model_copy(deep=True)
    cfg.model.path = str(model_path)
    worker, base_url = start_policy(cfg)
    env_actors = spawn_env_actors(cfg)
    try:
        ray.get(spawn_evaluator(cfg, str(out)).run.remote(tasks, base_url, cfg.eval.model_id, env_actors, worker))
    finally:
        ray.get([a.shutdown.remote() for a in env_actors])
        ray.get(worker.shutdown.remote())
    from orchestrator.eval_report import RECORDS_FILE, load_records
    records = load_records(out / RECORDS_FILE)
    return sum(bool(r["edited"]) for r in records) / len(records)


@pytest.fixture
def fresh_ray():
    import ray
    yield
    ray.shutdown()


def test_warm_start_teaches_the_agent_to_edit(tmp_path, fresh_ray):
    from orchestrator.cluster import spawn_learners, start_policy
    from orchestrator.parity import run_parity_probe
    from orchestrator.warm_start import warm_start
    from rl.config import load_config
    from rl.default_model import resolve_model_path
    from tests.envs_fixtures import toolz_tasks

    tasks = toolz_tasks()[:3]
    cfg = load_config("configs/default.yaml", EVAL + [
        "warm_start.demos_per_task=2", "warm_start.epochs=4", "warm_start.lr=1e-3", "warm_start.save_steps=1000",
        f"trainer.run_dir={tmp_path / 'run'}", "env.sandbox_uid_base=63800"])
    merged = warm_start(cfg, tmp_path / "ws", tasks)

    base = edited_fraction(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"k": 1})}, deep=True),
                           resolve_model_path("default"), tasks, tmp_path / "eval-base")
    warm = edited_fraction(cfg, merged, tasks, tmp_path / "eval-warm")
    assert warm > 0.5 and warm > base, f"edited fraction: base {base:.2f}, warm-started {warm:.2f}"

    served = cfg.model_copy(deep=True)     # the training dtype (fp32 on CPU) on both sides
    served.model.path, served.model.dtype = str(merged), "auto"
    worker, _ = start_policy(served)
    learners = spawn_learners(served, str(merged))
    from transformers import AutoTokenizer
    token_ids = AutoTokenizer.from_pretrained(merged)(served.sync.parity_text)["input_ids"]
    gap, _ = run_parity_probe(learners, [worker], token_ids, served.sync.parity_threshold, "on the merged warm start")
    assert gap < served.sync.parity_threshold
