"""The shipped warm-start (configs/warm_start/smollm2-135m): it loads as `model.path`, the engine
serves what the learner scores, it is not the base model, and its manifest keeps the split's
three sides apart."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.config import LearnerConfig, ModelConfig, RolloutConfig

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "warm_start" / "smollm2-135m"
PROMPT = ("<|im_start|>user\nFix the flipped comparison in `clamp`.<|im_end|>\n<|im_start|>assistant\n"
          "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"toolz/itertoolz.py\"}}\n</tool_call><|im_end|>\n")


@pytest.fixture(scope="module")
def merged() -> str:
    from modeling.default_model import resolve_model_path
    return resolve_model_path(str(SHIPPED))


def test_manifest_keeps_the_sides_apart_and_counts_its_rows():
    manifest = json.loads((SHIPPED / "manifest.json").read_text())
    split = manifest["split"]
    demo, train, test = (set(split[s]) for s in ("demo", "train", "test"))
    assert demo and test and demo <= train and not (train & test)
    from envs.tasks import load_tasks
    key = {t.id: t.function_key for t in load_tasks(SHIPPED.parents[2] / manifest["tasks_file"])}
    functions = [{key[i] for i in side} for side in (demo, train - demo, test)]
    assert not (functions[0] & functions[1] or functions[0] & functions[2] or functions[1] & functions[2])
    assert manifest["sft"]["rows"] >= 1000, manifest["sft"]["rows"]
    assert manifest["demos"]["kept"] <= manifest["demos"]["attempted"]
    assert (SHIPPED / "base_model.txt").read_text().strip() == "default"


def test_engine_serves_what_the_learner_scores_and_it_is_not_the_base(merged, model_path):
    from actors.learner import Learner
    from actors.rollout_worker import RolloutWorker

    worker = RolloutWorker(merged, RolloutConfig(max_model_len=512, max_tokens=8, dtype="float32"), ModelConfig())
    try:
        ids = worker.tokenizer.encode(PROMPT, add_special_tokens=False)
        served = worker.prompt_logprobs(ids)[1:]
    finally:
        worker.shutdown()
    shipped = Learner(merged, LearnerConfig(), ModelConfig(), seed=0).sequence_logprobs(ids)[1:]
    base = Learner(model_path, LearnerConfig(), ModelConfig(), seed=0).sequence_logprobs(ids)[1:]
    parity = max(abs(a - b) for a, b in zip(served, shipped))
    moved = sum(abs(a - b) for a, b in zip(shipped, base)) / len(base)
    assert parity < 0.02, f"engine vs learner on the shipped model: {parity:.4f}"
    assert moved > 0.05, f"the shipped adapter is (nearly) the base model: mean |Δ logprob| {moved:.4f}"
