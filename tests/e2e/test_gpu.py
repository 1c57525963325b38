"""On a CUDA GPU (marker `gpu`; skipped elsewhere): the vLLM engine's sleep and wake, weight sync
into a GPU engine (LoRA, merged, and merged over CUDA IPC), and served-vs-learner parity on a
Qwen3.5 (Gated-DeltaNet) checkpoint in the layout it ships in. A tiny random model with the 4B
model's head sizes. Engines run as the config's default does on GPU: CUDA graphs, so the first
test of a fresh machine also pays the compile (minutes), which the timeout allows for."""
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.parity import parity_gap
from rl.config import LearnerConfig, LoraConfig, ModelConfig, RolloutConfig, load_config
from rl.types import TrainSample

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]  # a cold compile of the first engine takes minutes
# bf16 on both sides: the GPU recipe's threshold (measured on the 4B shape), not the CPU fp32 default
REPO = Path(__file__).resolve().parents[2]
THRESHOLD = load_config(REPO / "configs" / "qwen35_4b_24gb.yaml").sync.parity_threshold
MODEL = ModelConfig(dtype="bfloat16")
RESULTS = os.environ.get("RLVR_GPU_RESULTS")  # a folder: each test also writes its numbers there


def _in_own_process(request, **env) -> bool:
    """vLLM's sleep-mode allocator is one per process ("CuMem allocator can only be used for one
    instance per process"): each engine-building test runs again in a pytest process of its own.
    True in the outer run, whose only job is that process's exit status."""
    if os.environ.get("RLVR_GPU_INNER"):
        return False
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", request.node.nodeid],
                          cwd=REPO, env={**os.environ, "RLVR_GPU_INNER": "1", **env})
    assert done.returncode == 0, f"{request.node.nodeid} failed in its own process (its output is above)"
    return True


def _record(name: str, data: dict) -> None:
    print(name, json.dumps(data))
    if RESULTS:
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, "gpu_tests.jsonl"), "a") as f:
            f.write(json.dumps({"test": name, **data}) + "\n")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tests.fixtures.qwen35_checkpoint import build
    out = tmp_path_factory.mktemp("qwen35-tiny")
    build(out, "tiny", device="cuda", end_token_p=0.1)
    return str(out)


def _worker(ckpt, sleep_level, lora):
    from actors.rollout_worker import RolloutWorker
    cfg = RolloutConfig(num_gpus=1, kv_cache_memory_gib=2, gpu_memory_utilization=0.2, max_model_len=1024,
                        max_tokens=24, temperature=0, sleep_level=sleep_level)
    return RolloutWorker(ckpt, cfg, MODEL, enable_lora=lora, max_lora_rank=8)


def _learner(ckpt):
    from actors.learner import Learner
    # PyTorch GDN path: fla autotunes every kernel for minutes on first use (its own test covers it)
    return Learner(ckpt, LearnerConfig(num_gpus=1, lr=2e-2, fast_kernels="off"), MODEL, seed=0,
                   lora=LoraConfig(rank=8, alpha=16))


def _train(learner, steps=3):
    rng = random.Random(0)
    vocab = 400
    for _ in range(steps):
        samples = [TrainSample(ids, [0] * 8 + [1] * 24, [-5.0] * 32, advantage=a, group_id="g")
                   for a in (1.0, -1.0) for ids in [[rng.randrange(vocab) for _ in range(32)]]]
        learner.train_step(samples)


def _probe(worker):
    return [int(t) for t in worker.tokenizer("The quick brown fox jumps over the lazy dog. def add(a, b):")["input_ids"]]


def test_sleep_wake_and_lora_sync_into_a_gpu_engine(request, tmp_path):
    if _in_own_process(request):
        return
    ckpt = request.getfixturevalue("ckpt")
    worker = _worker(ckpt, sleep_level=1, lora=True)
    learner = _learner(ckpt)
    try:
        prompt = _probe(worker)[:8]
        before = worker.generate([prompt], 1)[0][0].token_ids
        awake = worker.device_memory_gib()
        worker.sleep()
        asleep = worker.device_memory_gib()
        worker.wake()
        after = worker.generate([prompt], 1)[0][0].token_ids
        assert after == before, "greedy tokens changed across sleep/wake"
        assert awake - asleep > 1.5, f"sleep freed only {awake - asleep:.2f} GiB (the KV cache alone is 2)"

        probe = _probe(worker)
        base = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _train(learner)
        stale = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        worker.load_lora_adapter(learner.save_adapter(str(tmp_path / "adapter")))
        synced = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _record("lora_sync_level1", {"freed_gib": awake - asleep, "base_gap": base, "stale_gap": stale,
                                     "synced_gap": synced})
        assert base[0] < THRESHOLD and synced[0] < THRESHOLD
        assert stale[0] > THRESHOLD, "training did not move the learner away from the served policy"
    finally:
        worker.shutdown()


@pytest.mark.parametrize("engine_core", ["own_process", "in_process"])
def test_cuda_ipc_sync_into_a_captured_engine_and_sleep_wake(request, engine_core):
    """The merged update from the learner's GPU memory into an engine running CUDA graphs, in several
    buckets; the served policy then matches the learner, and greedy tokens survive sleep and wake.
    own_process: vLLM's engine core in its own process (as under Ray), so the CUDA IPC handle is
    opened there; in_process: the engine reads the learner's buffer directly."""
    if _in_own_process(request, VLLM_ENABLE_V1_MULTIPROCESSING="1" if engine_core == "own_process" else "0"):
        return
    ckpt = request.getfixturevalue("ckpt")
    worker = _worker(ckpt, sleep_level=1, lora=False)
    learner = _learner(ckpt)
    try:
        assert worker.cfg.eager(on_gpu=True)[0] is False, "the GPU default should capture CUDA graphs"
        probe = _probe(worker)
        base = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _train(learner)
        stale = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        assert worker.gpu_uuid() == learner.gpu_uuid()
        t0 = time.perf_counter()
        buckets = learner.ipc_plan(1 << 20)  # 1 MiB: several buckets even for the tiny model
        tensors = 0
        for i in range(buckets):
            tensors += worker.install_ipc_bucket(learner.ipc_bucket(i))
            learner.ipc_release()
        worker.finish_ipc_sync()
        sync_s = time.perf_counter() - t0
        synced = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        before = worker.generate([probe[:8]], 1)[0][0].token_ids
        worker.sleep()
        worker.wake()
        after = worker.generate([probe[:8]], 1)[0][0].token_ids
        woken = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _record(f"cuda_ipc_sync_graphs_{engine_core}", {"buckets": buckets, "tensors": tensors, "sync_s": sync_s, "base_gap": base,
                                         "stale_gap": stale, "synced_gap": synced, "after_wake_gap": woken,
                                         "greedy_same_after_wake": after == before})
        assert buckets > 1 and tensors == len(learner._ipc.layers)
        assert base[0] < THRESHOLD and synced[0] < THRESHOLD and woken[0] < THRESHOLD
        assert stale[0] > THRESHOLD, "training did not move the learner away from the served policy"
        assert after == before, "greedy tokens changed across sleep/wake with captured graphs"
    finally:
        worker.shutdown()


def test_merged_sync_and_level2_wake_reload_the_trained_weights(request, tmp_path):
    if _in_own_process(request):
        return
    ckpt = request.getfixturevalue("ckpt")
    worker = _worker(ckpt, sleep_level=2, lora=False)
    learner = _learner(ckpt)
    try:
        probe = _probe(worker)
        _train(learner)
        worker.reload_weights(learner.save_merged(str(tmp_path / "merged")))
        synced = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        awake = worker.device_memory_gib()
        worker.sleep()
        asleep = worker.device_memory_gib()
        worker.wake()                    # level 2 dropped the weights: the merged ones come back
        woken = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _record("merged_sync_level2", {"freed_gib": awake - asleep, "synced_gap": synced, "after_wake_gap": woken})
        assert synced[0] < THRESHOLD and woken[0] < THRESHOLD
        assert awake - asleep > 1.5
    finally:
        worker.shutdown()


def test_gated_deltanet_parity_prefill_and_decode(request):
    if _in_own_process(request):
        return
    ckpt = request.getfixturevalue("ckpt")
    from bench.gpu_parity import measure, prompts_for
    worker = _worker(ckpt, sleep_level=0, lora=False)
    learner = _learner(ckpt)
    try:
        res = measure(worker, learner, prompts_for(worker.tokenizer)[:6], 48)
        _record("gdn_parity_tiny", {**res, "learner_kernels": learner.fast_kernels.get("reason")})
        assert res["prefill_vs_learner"]["mean"] < THRESHOLD and res["decode_vs_learner"]["mean"] < THRESHOLD
    finally:
        worker.shutdown()
