"""Learner -> rollout-worker weight sync. One class per strategy, two transports.

- object_store (default): the learner puts the adapter folder (as bytes) or the merged
  tensors into Ray's object store once; every rollout worker pulls them to its own node and
  installs them from memory (merged) or from a node-local folder (LoRA). No node needs to
  see another's filesystem.
- shared_dir: the learner writes the adapter or merged model under the run directory and
  the workers load that path; every node must then mount the run directory.

The parity probe after each sync (orchestrator.parity) guards both.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import ray

TRANSPORTS = ("object_store", "shared_dir")


class WeightSync:
    name = "base"

    def __init__(self, run_dir: Path, transport: str = "object_store"):
        if transport not in TRANSPORTS:
            raise ValueError(f"sync.transport must be one of {TRANSPORTS}, got {transport!r}")
        self.run_dir = Path(run_dir)
        self.transport = transport

    def sync(self, learner, workers: list, step: int) -> None:
        raise NotImplementedError


class LoraAdapterSync(WeightSync):
    """Hot-load the LoRA adapter; the worker gives every load a fresh adapter id, so vLLM's
    adapter cache can never keep serving the previous one."""
    name = "lora"

    def sync(self, learner, workers: list, step: int) -> None:
        if self.transport == "object_store":
            files = learner.adapter_files_ref()
            ray.get([w.install_lora.remote(files) for w in workers])
            return
        root = self.run_dir / "adapters"
        path = learner.save_adapter(str(root / f"step_{step:06d}"))
        ray.get([w.load_lora_adapter.remote(path) for w in workers])
        for old in sorted(root.glob("step_*"))[:-1]:
            shutil.rmtree(old)


class MergedWeightsSync(WeightSync):
    """Merge LoRA into the base weights and have vLLM reload them in place (`reload_weights`).
    merge_on="engine": the learner sends only the LoRA factors and each worker folds them into
    the base weights it read from the model folder (a few MB per sync instead of the model)."""
    name = "merged"

    def __init__(self, run_dir: Path, transport: str = "object_store", merge_on: str = "learner"):
        super().__init__(run_dir, transport)
        if merge_on not in ("learner", "engine"):
            raise ValueError(f"sync.merge_on must be 'learner' or 'engine', got {merge_on!r}")
        self.merge_on = merge_on

    def sync(self, learner, workers: list, step: int) -> None:
        if self.merge_on == "engine":  # the factors are small: the object store serves any node
            factors = learner.lora_factors_ref()
            ray.get([w.install_lora_merged.remote(factors) for w in workers])
            return
        if self.transport == "object_store":
            tensors = learner.merged_weights_ref()
            ray.get([w.install_weights.remote(tensors) for w in workers])
            return
        path = learner.save_merged(str(self.run_dir / "merged_weights"))
        ray.get([w.reload_weights.remote(path) for w in workers])


def make_weight_sync(strategy: str, run_dir: Path, transport: str = "object_store",
                     merge_on: str = "learner") -> WeightSync:
    if strategy == "lora":
        return LoraAdapterSync(run_dir, transport)
    if strategy == "merged":
        return MergedWeightsSync(run_dir, transport, merge_on)
    raise ValueError(f"sync.strategy must be 'lora' or 'merged', got {strategy!r}")
