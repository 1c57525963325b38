"""On a CUDA GPU (marker `gpu`; skipped elsewhere): the vLLM engine's sleep and wake, weight sync
into a GPU engine (LoRA, merged, and merged over CUDA IPC), and served-vs-learner parity on a
Qwen3.5 (Gated-DeltaNet) checkpoint in the layout it ships in. A tiny random model with the 4B
model's head sizes. Engines run as the config's default does on GPU: CUDA graphs, so the first
test of a fresh machine also pays the compile (minutes), which the budget allows for.

Each test runs in a pytest process of its own and names its phases as it goes; past
RLVR_GPU_TEST_BUDGET_S its process dumps every thread's stack and ends, and the test fails
naming the phase it was in (a hang is a failure with a place, not a stuck suite)."""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.parity import parity_gap
from rl.config import LearnerConfig, LoraConfig, ModelConfig, RolloutConfig, load_config
from rl.types import TrainSample
from tests.fixtures.gpu_budget import BUDGET_S, arm, disarm

pytestmark = pytest.mark.gpu  # bounded by tests/conftest.py (gpu_budget) and _in_own_process
# bf16 on both sides: the GPU recipe's threshold (measured on the 4B shape), not the CPU fp32 default
REPO = Path(__file__).resolve().parents[2]
THRESHOLD = load_config(REPO / "configs" / "qwen35_4b_24gb.yaml").sync.parity_threshold
MODEL = ModelConfig(dtype="bfloat16")
RESULTS = os.environ.get("RLVR_GPU_RESULTS")  # a folder: each test also writes its numbers there
PHASE_FILE = "RLVR_GPU_PHASE_FILE"
STARTED = time.monotonic()


def _in_own_process(request, **env) -> bool:
    """vLLM's sleep-mode allocator is one per process ("CuMem allocator can only be used for one
    instance per process"): each engine-building test runs again in a pytest process of its own,
    bounded by BUDGET_S (the inner process's own watchdog) and a little more here (a process too
    stuck for that). True in the outer run, whose only job is that process's exit status."""
    if os.environ.get("RLVR_GPU_INNER"):
        arm(BUDGET_S)  # needs no GIL: fires in a stuck CUDA call too
        request.addfinalizer(disarm)
        return False
    fd, phase_file = tempfile.mkstemp(prefix="rlvr-gpu-phase-")
    os.close(fd)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", request.node.nodeid],
                            cwd=REPO, env={**os.environ, "RLVR_GPU_INNER": "1", PHASE_FILE: phase_file, **env},
                            start_new_session=True)  # its engine's processes are stopped with it
    try:
        rc = proc.wait(timeout=BUDGET_S + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = None
    took = time.monotonic() - t0
    phase = Path(phase_file).read_text().strip() or "before its first phase"
    os.unlink(phase_file)
    _record(request.node.name, {"wall_s": round(took, 1), "rc": rc, "last_phase": phase})
    if rc is None or (rc != 0 and took >= BUDGET_S):
        pytest.fail(f"{request.node.nodeid} ran past its {BUDGET_S:.0f} s budget in phase {phase!r} "
                    f"(RLVR_GPU_TEST_BUDGET_S; every thread's stack is above)")
    assert rc == 0, f"{request.node.nodeid} failed in its own process in phase {phase!r} (its output is above)"
    return True


def _phase(name: str) -> None:
    """The inner test's current phase: printed, and written where the outer run reads it when the
    test fails or runs out of time."""
    line = f"{name} (at {time.monotonic() - STARTED:.0f} s)"
    print(f"[phase] {line}", flush=True)
    if os.environ.get(PHASE_FILE):
        Path(os.environ[PHASE_FILE]).write_text(line)


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


def _start(request, sleep_level, lora):
    """The test's checkpoint, engine and learner, each a phase."""
    _phase("build the tiny checkpoint")
    ckpt = request.getfixturevalue("ckpt")
    _phase(f"engine start (sleep level {sleep_level}, LoRA {lora}, CUDA graphs: compile or cache)")
    worker = _worker(ckpt, sleep_level=sleep_level, lora=lora)
    try:
        _phase("learner start")
        return worker, _learner(ckpt)
    except BaseException:
        worker.shutdown()
        raise


def _shutdown(worker) -> None:
    _phase("engine shutdown")
    worker.shutdown()


def test_sleep_wake_and_lora_sync_into_a_gpu_engine(request, tmp_path):
    if _in_own_process(request):
        return
    worker, learner = _start(request, sleep_level=1, lora=True)
    try:
        _phase("generate before sleep")
        prompt = _probe(worker)[:8]
        before = worker.generate([prompt], 1)[0][0].token_ids
        awake = worker.device_memory_gib()
        _phase("sleep (level 1)")
        worker.sleep()
        asleep = worker.device_memory_gib()
        _phase("wake (level 1)")
        worker.wake()
        _phase("generate after wake")
        after = worker.generate([prompt], 1)[0][0].token_ids
        assert after == before, "greedy tokens changed across sleep/wake"
        assert awake - asleep > 1.5, f"sleep freed only {awake - asleep:.2f} GiB (the KV cache alone is 2)"

        _phase("parity probe (base)")
        probe = _probe(worker)
        base = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _phase("train")
        _train(learner)
        stale = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _phase("LoRA sync (save adapter, hot-load)")
        worker.load_lora_adapter(learner.save_adapter(str(tmp_path / "adapter")))
        _phase("parity probe (synced)")
        synced = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _record("lora_sync_level1", {"freed_gib": awake - asleep, "base_gap": base, "stale_gap": stale,
                                     "synced_gap": synced})
        assert base[0] < THRESHOLD and synced[0] < THRESHOLD
        assert stale[0] > THRESHOLD, "training did not move the learner away from the served policy"
    finally:
        _shutdown(worker)


@pytest.mark.parametrize("engine_core", ["own_process", "in_process"])
def test_cuda_ipc_sync_into_a_captured_engine_and_sleep_wake(request, engine_core):
    """The merged update from the learner's GPU memory into an engine running CUDA graphs, in several
    buckets; the served policy then matches the learner, and greedy tokens survive sleep and wake.
    own_process: vLLM's engine core in its own process (as under Ray), so the CUDA IPC handle is
    opened there; in_process: the engine reads the learner's buffer directly."""
    if _in_own_process(request, VLLM_ENABLE_V1_MULTIPROCESSING="1" if engine_core == "own_process" else "0"):
        return
    worker, learner = _start(request, sleep_level=1, lora=False)
    try:
        assert worker.cfg.eager(on_gpu=True)[0] is False, "the GPU default should capture CUDA graphs"
        _phase("parity probe (base)")
        probe = _probe(worker)
        base = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _phase("train")
        _train(learner)
        stale = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        assert worker.gpu_uuid() == learner.gpu_uuid()
        _phase("CUDA IPC sync (buckets)")
        t0 = time.perf_counter()
        buckets = learner.ipc_plan(1 << 20)  # 1 MiB: several buckets even for the tiny model
        tensors = 0
        for i in range(buckets):
            tensors += worker.install_ipc_bucket(learner.ipc_bucket(i))
            learner.ipc_release()
        worker.finish_ipc_sync()
        sync_s = time.perf_counter() - t0
        _phase("parity probe (synced)")
        synced = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        before = worker.generate([probe[:8]], 1)[0][0].token_ids
        _phase("sleep (level 1)")
        worker.sleep()
        _phase("wake (level 1)")
        worker.wake()
        _phase("generate and parity probe after wake")
        after = worker.generate([probe[:8]], 1)[0][0].token_ids
        woken = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _record(f"cuda_ipc_sync_graphs_{engine_core}", {"buckets": buckets, "tensors": tensors, "sync_s": sync_s,
                                                        "base_gap": base, "stale_gap": stale, "synced_gap": synced,
                                                        "after_wake_gap": woken,
                                                        "greedy_same_after_wake": after == before})
        assert buckets > 1 and tensors == len(learner._ipc.layers)
        assert base[0] < THRESHOLD and synced[0] < THRESHOLD and woken[0] < THRESHOLD
        assert stale[0] > THRESHOLD, "training did not move the learner away from the served policy"
        assert after == before, "greedy tokens changed across sleep/wake with captured graphs"
    finally:
        _shutdown(worker)


def test_merged_sync_and_level2_wake_reload_the_trained_weights(request, tmp_path):
    if _in_own_process(request):
        return
    worker, learner = _start(request, sleep_level=2, lora=False)
    try:
        probe = _probe(worker)
        _phase("train")
        _train(learner)
        _phase("save the merged model")
        merged = learner.save_merged(str(tmp_path / "merged"))
        _phase("reload_weights from the merged folder (awake)")
        worker.reload_weights(merged)
        _phase("parity probe (synced)")
        synced = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        awake = worker.device_memory_gib()
        _phase("sleep (level 2)")
        worker.sleep()
        asleep = worker.device_memory_gib()
        _phase("wake (level 2: weights, reload_weights, KV cache)")
        worker.wake()                    # level 2 dropped the weights: the merged ones come back
        _phase("parity probe after wake")
        woken = parity_gap(learner.sequence_logprobs(probe), worker.prompt_logprobs(probe))
        _record("merged_sync_level2", {"freed_gib": awake - asleep, "synced_gap": synced, "after_wake_gap": woken})
        assert synced[0] < THRESHOLD and woken[0] < THRESHOLD
        assert awake - asleep > 1.5
    finally:
        _shutdown(worker)


def test_gated_deltanet_parity_prefill_and_decode(request):
    if _in_own_process(request):
        return
    from bench.gpu_parity import measure, prompts_for
    worker, learner = _start(request, sleep_level=0, lora=False)
    try:
        _phase("prefill and decode parity")
        res = measure(worker, learner, prompts_for(worker.tokenizer)[:6], 48)
        _record("gdn_parity_tiny", {**res, "learner_kernels": learner.fast_kernels.get("reason")})
        assert res["prefill_vs_learner"]["mean"] < THRESHOLD and res["decode_vs_learner"]["mean"] < THRESHOLD
    finally:
        _shutdown(worker)
