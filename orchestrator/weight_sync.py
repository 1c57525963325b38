"""Learner -> rollout-worker weight sync. One class per strategy.

Both strategies publish the new policy under the run directory, which every node must be
able to read (it holds the checkpoints too: on a cluster it lives on shared storage).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import ray


class WeightSync:
    name = "base"

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def sync(self, learner, workers: list, step: int) -> None:
        raise NotImplementedError


class LoraAdapterSync(WeightSync):
    """Hot-load the LoRA adapter; the worker gives every load a fresh adapter id, so vLLM's
    adapter cache can never keep serving the previous one."""
    name = "lora"

    def sync(self, learner, workers: list, step: int) -> None:
        root = self.run_dir / "adapters"
        path = learner.save_adapter(str(root / f"step_{step:06d}"))
        ray.get([w.load_lora_adapter.remote(path) for w in workers])
        for old in sorted(root.glob("step_*"))[:-1]:
            shutil.rmtree(old)


class MergedWeightsSync(WeightSync):
    """Merge LoRA into the base weights and have vLLM reload them (`reload_weights`)."""
    name = "merged"

    def sync(self, learner, workers: list, step: int) -> None:
        path = learner.save_merged(str(self.run_dir / "merged_weights"))
        ray.get([w.reload_weights.remote(path) for w in workers])


STRATEGIES = {cls.name: cls for cls in (LoraAdapterSync, MergedWeightsSync)}


def make_weight_sync(strategy: str, run_dir: Path) -> WeightSync:
    return STRATEGIES[strategy](run_dir)
