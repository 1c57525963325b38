"""Learner -> rollout-worker weight sync. One class per strategy.

Both strategies hand the workers a folder on the worker's own node: the LoRA adapter is
small, so it travels as bytes through the object store (works across nodes); merged
weights are large, so they go through a path the workers can read (one node, or shared
storage on a cluster).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import ray


def read_folder(path: str) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in Path(path).rglob("*") if p.is_file()}


def write_folder(files: dict[str, bytes], path: str) -> str:
    root = Path(path)
    shutil.rmtree(root, ignore_errors=True)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return str(root)


class WeightSync:
    name = "base"

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def sync(self, learner, workers: list, step: int) -> None:
        raise NotImplementedError


class LoraAdapterSync(WeightSync):
    """Hot-load the LoRA adapter; every load gets a fresh adapter id in the worker."""
    name = "lora"

    def sync(self, learner, workers: list, step: int) -> None:
        staging = tempfile.mkdtemp(prefix=f"adapter-{step}-")
        path = ray.get(learner.save_adapter.remote(staging))
        files_ref = ray.put(read_folder(path))
        shutil.rmtree(staging, ignore_errors=True)
        ray.get([w.load_lora_adapter_files.remote(files_ref, f"step_{step}") for w in workers])


class MergedWeightsSync(WeightSync):
    """Merge LoRA into the base weights and have vLLM reload them (`reload_weights`)."""
    name = "merged"

    def sync(self, learner, workers: list, step: int) -> None:
        path = self.run_dir / "merged_weights"
        ray.get(learner.save_merged.remote(str(path)))
        ray.get([w.reload_weights.remote(str(path)) for w in workers])


STRATEGIES = {cls.name: cls for cls in (LoraAdapterSync, MergedWeightsSync)}


def make_weight_sync(strategy: str, run_dir: Path) -> WeightSync:
    return STRATEGIES[strategy](run_dir)
