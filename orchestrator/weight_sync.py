"""Learner -> rollout-worker weight sync: one class per `sync.strategy`, two transports.

- object_store (default): the learner puts the adapter folder (as bytes) or the merged
  tensors into Ray's object store once; every rollout worker pulls them to its own node and
  installs them from memory (merged) or from a node-local folder (LoRA). No node needs to
  see another's filesystem.
- shared_dir: the learner writes the adapter or merged model under the run directory and
  the workers load that path; every node must then mount the run directory.
- merged_on_engine: only the LoRA factors travel (object store); each engine folds them in.
- cuda_ipc (merged, one GPU): the merged weights go from the learner's GPU memory to the
  engine's without a host copy; its own module, actors/sync_cuda_ipc.py, holds all three sides.

The parity probe after each sync (orchestrator.parity) guards both. `start` issues a sync
without waiting (each actor runs its calls in the order the driver made them), so an overlapped
loop can let the engines apply it while the learner trains the next step (`IssuedSync`).
"""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import ray

from actors.sync_cuda_ipc import CudaIpcSync
from orchestrator.parity import finish_parity_probe, start_parity_probe

TRANSPORTS = ("object_store", "shared_dir")


class WeightSync:
    name = "base"

    def __init__(self, run_dir: Path, transport: str = "object_store"):
        if transport not in TRANSPORTS:
            raise ValueError(f"sync.transport must be one of {TRANSPORTS}, got {transport!r}")
        self.run_dir = Path(run_dir)
        self.transport = transport

    def start(self, learner, workers: list, step: int) -> list[ray.ObjectRef]:
        """Issue the sync; the returned refs resolve once every worker serves the new weights."""
        raise NotImplementedError

    def sync(self, learner, workers: list, step: int) -> None:
        ray.get(self.start(learner, workers, step))


class LoraAdapterSync(WeightSync):
    """Hot-load the LoRA adapter; the worker gives every load a fresh adapter id, so vLLM's
    adapter cache can never keep serving the previous one."""
    name = "lora"

    def start(self, learner, workers: list, step: int) -> list[ray.ObjectRef]:
        if self.transport == "object_store":
            files = learner.adapter_files_ref()
            return [w.install_lora.remote(files) for w in workers]
        root = self.run_dir / "adapters"
        for old in sorted(root.glob("step_*")):  # loaded by the previous sync, which has completed
            shutil.rmtree(old)
        path = learner.save_adapter(str(root / f"step_{step:06d}"))
        return [w.load_lora_adapter.remote(path) for w in workers]


class MergedWeightsSync(WeightSync):
    """Merge LoRA into the base weights and have vLLM reload them in place (`reload_weights`).
    merge_on="engine" (sync.strategy=merged_on_engine): the learner sends only the LoRA factors and each worker folds them into
    the base weights it read from the model folder (a few MB per sync instead of the model)."""
    name = "merged"

    def __init__(self, run_dir: Path, transport: str = "object_store", merge_on: str = "learner"):
        super().__init__(run_dir, transport)
        if merge_on not in ("learner", "engine"):
            raise ValueError(f"merge_on must be 'learner' or 'engine', got {merge_on!r}")
        self.merge_on = merge_on

    def start(self, learner, workers: list, step: int) -> list[ray.ObjectRef]:
        if self.merge_on == "engine":  # the factors are small: the object store serves any node
            factors = learner.lora_factors_ref()
            return [w.install_lora_merged.remote(factors) for w in workers]
        if self.transport == "object_store":
            tensors = learner.merged_weights_ref()
            return [w.install_weights.remote(tensors) for w in workers]
        path = learner.save_merged(str(self.run_dir / "merged_weights"))
        return [w.reload_weights.remote(path) for w in workers]


def make_weight_sync(strategy: str, run_dir: Path, transport: str = "object_store",
                     bucket_mib: int = 512) -> WeightSync | CudaIpcSync:
    """The sync for one `sync.strategy` (rl.config.SyncConfig says what each does)."""
    if strategy == "cuda_ipc":  # merged weights that stay on the GPU: the strategy's own module
        return CudaIpcSync(bucket_mib)
    if strategy == "lora":
        return LoraAdapterSync(run_dir, transport)
    if strategy in ("merged", "merged_on_engine"):
        return MergedWeightsSync(run_dir, transport, merge_on="engine" if strategy == "merged_on_engine" else "learner")
    raise ValueError(f"sync.strategy must be one of lora, merged, merged_on_engine, cuda_ipc; got {strategy!r}")


class IssuedSync:
    """A sync and the parity probe after it, issued without waiting. The learner computes the
    factors and its probe log-probs before its next update (its calls run in order), the engines
    install and answer while that update runs; the next rollout calls `wait` before its first
    request. `wait` is idempotent and thread-safe: the rollout thread and the loop both call it."""

    def __init__(self, weight_sync: WeightSync | CudaIpcSync | None, learner, workers: list, step: int, parity_ids: list[int],
                 threshold: float, when: str):
        self._refs = weight_sync.start(learner, workers, step) if weight_sync else []
        self._probe = start_parity_probe(learner, workers, parity_ids)
        self._threshold, self._when = threshold, when
        self._lock = threading.Lock()
        self._result: tuple[float, float, float] | None = None

    def wait(self) -> tuple[float, float, float]:
        """(mean gap, max gap, seconds waited); raises ParityError as the synchronous probe does."""
        with self._lock:
            if self._result is None:
                t0 = time.time()
                ray.get(self._refs)
                gap, gap_max = finish_parity_probe(self._probe, self._threshold, self._when)
                self._result = (gap, gap_max, time.time() - t0)
            return self._result
