"""rlvr sweep's arms: each its share of one GPU, a new run or a resumed one, overrides after --values."""
from __future__ import annotations

from cli.sweep import arm_command, arm_dir, arm_shares
from rl.config import load_config


def test_three_arms_share_one_card_and_a_cpu_config_is_left_alone():
    gpu = load_config("configs/pi_1gpu.yaml")
    shares = dict(s.split("=") for s in arm_shares(gpu, 3))
    assert float(shares["rollout.num_gpus"]) + float(shares["learner.num_gpus"]) <= 1 / 3 + 1e-3
    assert float(shares["learner.gpu_memory_fraction"]) == gpu.learner.gpu_memory_fraction   # 0.15 x 3 fits
    assert float(shares["rollout.gpu_memory_utilization"]) <= 0.15
    load_config("configs/pi_1gpu.yaml", list(arm_shares(gpu, 3)))   # the shares are valid overrides
    assert arm_shares(load_config("configs/default.yaml"), 3) == []


def test_an_arm_starts_a_run_or_resumes_its_own(tmp_path):
    run = arm_dir(tmp_path, "learner.lr", "5e-5")
    assert run.name == "lr-5e-5"
    new = arm_command("configs/pi_1gpu.yaml", ["trainer.steps=4"], run, "learner.lr", "5e-5", "127.0.0.1:6379", [], 500)
    assert new[3:6] == ["train", "configs/pi_1gpu.yaml", "trainer.steps=4"]
    assert f"trainer.run_dir={run}" in new and "learner.lr=5e-5" in new and "ray.address=127.0.0.1:6379" in new
    assert new[-2:] == ["--time-limit", "500"]
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    again = arm_command("configs/pi_1gpu.yaml", ["trainer.steps=4"], run, "learner.lr", "5e-5", "h:1", [], None)
    assert again[3:7] == ["train", "--resume", str(run), "trainer.steps=4"] and "configs/pi_1gpu.yaml" not in again
    assert "--time-limit" not in again
