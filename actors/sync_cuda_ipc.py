"""sync.strategy=cuda_ipc: the learner's merged weights reach a vLLM engine on the same GPU
without leaving it.

Why: on one card the object-store path takes the merged model to host memory and back (28-40 s
a step for the Qwen3.5-4B shape, docs/results/gpu-colocated-h200), and a LoRA adapter in the
engine slows every decode step. Here the engine serves plain weights and a sync only copies GPU
memory into GPU memory:

- learner (`MergedBuckets`): every LoRA-adapted weight, W + scale * B @ A, is merged on the GPU
  straight into a flat buffer of at most `sync.bucket_mib`; the buffer leaves as a CUDA IPC
  handle (torch's `reduce_tensor`) with each tensor's checkpoint name, offset and shape. Weights
  without an adapter never change, so they never travel. One buffer is alive at a time.
- engine (`IpcWeightLoader`, vLLM's `worker_extension_cls`, inside the engine's GPU worker):
  opens the handle, hands views of it to the model's own `load_weights` (which copies into the
  existing parameters, so captured CUDA graphs stay valid), waits for the copies, lets go.
- driver (`CudaIpcSync`): chains bucket -> install -> release for every bucket as Ray calls that
  wait on each other's results, so no weight and no round trip passes through the driver.

The handle only opens on the card it was made on: across nodes use sync.transport=object_store.
"""
from __future__ import annotations

import math
import os
import pickle
from typing import Any

ADAPTER = "default"  # PEFT's adapter name (actors.learner.ADAPTER_NAME)
_IN_PROCESS: dict[int, Any] = {}  # the bucket each MergedBuckets of this process is exporting
WORKER_EXTENSION = "actors.sync_cuda_ipc.IpcWeightLoader"


def device_uuid(device: Any = None) -> str:
    """The card's UUID as this process sees it: two processes share a GPU iff these agree."""
    import torch
    index = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    return str(torch.cuda.get_device_properties(index).uuid)


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive indices grouped so each group's bytes stay within bucket_bytes (a tensor larger
    than that travels alone)."""
    buckets: list[list[int]] = []
    used = bucket_bytes
    for i, size in enumerate(sizes):
        if used + size > bucket_bytes and (not buckets or buckets[-1]):
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += size
    return buckets


def adapted_weights(model, layout=None) -> list[tuple[str, Any]]:
    """(checkpoint key, LoRA layer) for every adapted weight of a PEFT model, in module order."""
    from peft.tuners.lora import LoraLayer

    out = []
    for name, m in model.get_base_model().named_modules():
        if not (isinstance(m, LoraLayer) and ADAPTER in m.lora_A):
            continue
        if m.fan_in_fan_out:
            raise ValueError(f"{name}: fan_in_fan_out LoRA layers are not supported by sync.strategy=cuda_ipc")
        key = f"{name.replace('.base_layer', '')}.weight"
        out.append((layout.to_checkpoint_key(key) if layout is not None else key, m))
    return out


class MergedBuckets:
    """Learner side: the merged adapted weights, exported one bucket at a time."""

    def __init__(self, model, layout, bucket_bytes: int):
        self.layers = adapted_weights(model, layout)
        if not self.layers:
            raise ValueError("sync.strategy=cuda_ipc: the model has no LoRA-adapted weight to send")
        weights = [m.get_base_layer().weight for _, m in self.layers]
        dtypes = {w.dtype for w in weights}
        if len(dtypes) != 1:
            raise ValueError(f"sync.strategy=cuda_ipc packs one dtype per buffer; the adapted weights have {dtypes}")
        self.buckets = plan_buckets([w.numel() * w.element_size() for w in weights], bucket_bytes)
        self._held = None

    def merged(self, i: int):
        """(flat buffer, [(key, offset, shape)]) of bucket i: W + scale * B @ A of each of its weights,
        merged on the weights' device straight into one buffer."""
        import torch

        entries = [self.layers[j] for j in self.buckets[i]]
        first = entries[0][1].get_base_layer().weight
        flat = torch.empty(sum(m.get_base_layer().weight.numel() for _, m in entries), dtype=first.dtype,
                           device=first.device)
        meta, offset = [], 0
        with torch.no_grad():
            for key, m in entries:
                w = m.get_base_layer().weight
                torch.add(w, m.get_delta_weight(ADAPTER).to(w.dtype), out=flat[offset:offset + w.numel()].view(w.shape))
                meta.append((key, offset, tuple(w.shape)))
                offset += w.numel()
        return flat, meta

    def export(self, i: int) -> bytes:
        """Bucket i merged into a fresh GPU buffer, kept alive until `release`, as its IPC handle and layout."""
        from torch.multiprocessing.reductions import reduce_tensor

        if self._held is not None:
            raise RuntimeError("MergedBuckets.export: the previous bucket was not released")
        flat, meta = self.merged(i)
        self._held = _IN_PROCESS[id(self)] = flat
        return pickle.dumps((os.getpid(), id(self), reduce_tensor(flat), meta))

    def release(self) -> None:
        """The engines have copied the bucket: free it (and the IPC bookkeeping torch keeps for it)."""
        import torch
        held, self._held = self._held, None
        _IN_PROCESS.pop(id(self), None)
        if held is not None and held.is_cuda:
            del held
            torch.cuda.ipc_collect()


def open_bucket(payload: bytes, device_index: int):
    """(flat tensor, [(key, view)]) from an exported bucket, opened on this process's device; an
    engine in the learner's own process (vLLM's in-process engine core) reads the buffer directly,
    since CUDA does not open a process's own IPC handle."""
    pid, owner, (rebuild, args), meta = pickle.loads(payload)  # from the learner of the same run, never outside
    if pid == os.getpid() and owner in _IN_PROCESS:
        flat = _IN_PROCESS[owner]
        # the handle's reference count will not be opened here: release it, as torch does for a cached storage
        args[4]._release_ipc_counter(args[11], args[12], device=device_index)
    else:
        args = list(args)
        args[6] = device_index  # storage_device: the same card, as this process numbers it
        flat = rebuild(*args)
    return flat, [(key, flat[off:off + math.prod(shape)].view(shape)) for key, off, shape in meta]


class IpcWeightLoader:
    """Engine side: methods vLLM mixes into its GPU worker (EngineArgs.worker_extension_cls),
    called through `collective_rpc("load_ipc_bucket", args=(payload,))`."""

    def load_ipc_bucket(self, payload: bytes) -> int:
        import torch

        flat, weights = open_bucket(payload, torch.cuda.current_device())
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(iter(weights))
        torch.cuda.synchronize()  # the copies are done before the learner frees the buffer
        count = len(weights)
        del flat, weights
        return count


class CudaIpcSync:
    """Driver side of sync.strategy=cuda_ipc (orchestrator.weight_sync
    builds it). Rank 0's weights are every rank's; its GPU must be the engines' GPU."""
    name = "merged"

    def __init__(self, bucket_mib: int = 512):
        self.bucket_bytes = bucket_mib << 20
        self._buckets: int | None = None

    def _plan(self, rank0, workers: list) -> int:
        import ray

        learner_gpu, *engine_gpus = ray.get([rank0.gpu_uuid.remote(), *[w.gpu_uuid.remote() for w in workers]])
        apart = [i for i, g in enumerate(engine_gpus) if g != learner_gpu]
        if apart:
            raise RuntimeError(f"sync.strategy=cuda_ipc: rollout worker(s) {apart} are not on the learner's GPU "
                               f"({learner_gpu}); colocate them (rollout.num_gpus + learner.num_gpus <= 1 on one "
                               f"node) or use sync.transport=object_store")
        return ray.get(rank0.ipc_plan.remote(self.bucket_bytes))

    def start(self, learner, workers: list, step: int) -> list:
        """Issue every bucket's export, installs and release; the refs resolve once each engine
        serves the new weights."""
        rank0 = learner.actors[0]
        if self._buckets is None:
            self._buckets = self._plan(rank0, workers)
        released = []
        for i in range(self._buckets):
            payload = rank0.ipc_bucket.remote(i)
            installed = [w.install_ipc_bucket.remote(payload) for w in workers]
            released.append(rank0.ipc_release.remote(*installed))  # waits for every engine's copy
        return [w.finish_ipc_sync.remote(*released) for w in workers]

    def sync(self, learner, workers: list, step: int) -> None:
        import ray
        ray.get(self.start(learner, workers, step))
