"""Scale-out on a real two-node Ray cluster (tests/two_node.py: network namespaces, a veth
pair, and a worker node that cannot see the head's run directory). Jobs go through
`ray job submit`; actors are pinned to nodes by custom resources; one run is killed
mid-step and resumed with its learner on the node without the checkpoints."""
import json
import os
import sys
from pathlib import Path

import pytest

from orchestrator.metrics import read_metrics
from rl.config import load_config
from tests.two_node import REPO, TwoNodeCluster, can_make_namespaces, entrypoint, readme_commands

pytestmark = pytest.mark.skipif(can_make_namespaces() is not None, reason=str(can_make_namespaces()))

TRAIN = [sys.executable, "-m", "cli.main", "train"]


def placed(**roles: str) -> list[str]:
    """Overrides pinning each role to the node kind named (head/worker), replacing any pin."""
    return [f"ray.role_resources.{role}={{{node}_node: 1}}" for role, node in roles.items()]


def check_run(run_dir: Path, cluster: TwoNodeCluster, steps: int, **roles: str) -> list[dict]:
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), "a step was lost or repeated"
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.sync.transport == "object_store"
    ips = {"head": cluster.head_ip, "worker": cluster.worker_ip}
    for m in metrics:
        assert m["parity_gap"] < cfg.sync.parity_threshold
        for role, node in roles.items():
            assert m["nodes"][f"{role}/0"] == ips[node], (role, m["nodes"])
    return metrics


def kill_mid_step_and_resume(cluster: TwoNodeCluster, entry: list[str], run_dir: Path, timeout: float) -> str:
    """Run until step 1 is recorded (step 2 under way), stop the job, resume it with the
    README's resume command; returns the resumed job's logs."""
    job = cluster.submit(entry)
    status = cluster.wait(job, timeout, until=lambda: any(m["step"] == 1 for m in read_metrics(run_dir)))
    assert status == "RUNNING", cluster.logs(job)[-4000:]
    cluster.stop(job)
    assert [m["step"] for m in read_metrics(run_dir)] == [1]
    resumed = cluster.submit(entrypoint(readme_commands()["resume"], **{"$PWD/runs/cluster": str(run_dir)}))
    status = cluster.wait(resumed, timeout)
    logs = cluster.logs(resumed)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "resumed from" in logs and "continuing at step 2" in logs
    return logs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with TwoNodeCluster(hidden=tmp_path_factory.mktemp("head"), env=dict(os.environ)) as c:
        yield c


@pytest.mark.heavy
def test_length_run_with_the_learner_on_a_node_without_the_run_dir(cluster, model_path):
    """Rollout worker on the head, learner on the worker node: the LoRA adapter, the
    checkpoint and its restore all cross nodes through Ray; killed mid-step, resumed."""
    run_dir = cluster.hidden / "length"
    entry = [*TRAIN, str(REPO / "configs" / "length.yaml"), "ray.address=auto", f"trainer.run_dir={run_dir}",
             "trainer.steps=2", "trainer.batch_size=2", "trainer.group_size=4", "ray.placement_strategy=SPREAD",
             *placed(rollout="head", learner="worker")]
    kill_mid_step_and_resume(cluster, entry, run_dir, timeout=900)
    check_run(run_dir, cluster, 2, rollout="head", learner="worker")
    assert (run_dir / "checkpoints" / "step_000002" / "learner" / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.heavy
def test_coding_runs_with_env_actors_and_pi_on_the_worker_node(cluster, model_path):
    """The README's submit command (2 GRPO steps of the pi coding config, environment actors
    and pi on the worker node, rollout + learner on the head), then the same with the
    learner on the worker node, killed mid-step and resumed."""
    small = ["trainer.steps=2", "trainer.batch_size=1", "trainer.group_size=2", "scaffold.max_turns=2",
             "scaffold.wall_clock_s=600", "rollout.max_tokens=96"]

    def readme_run(run_dir: Path) -> list[str]:
        return [*entrypoint(readme_commands()["submit"], HEAD_IP=cluster.head_ip,
                            **{"$PWD/runs/cluster": str(run_dir)}), *small]

    first = cluster.hidden / "coding-a"
    job = cluster.submit(readme_run(first))
    status = cluster.wait(job, 1800)
    assert status == "SUCCEEDED", cluster.logs(job)[-4000:]
    check_run(first, cluster, 2, rollout="head", learner="head", env="worker")

    second = cluster.hidden / "coding-b"
    kill_mid_step_and_resume(cluster, [*readme_run(second), *placed(learner="worker")], second, 1800)
    check_run(second, cluster, 2, rollout="head", learner="worker", env="worker")
    for run in (first, second):
        episodes = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
        assert {e["step"] for e in episodes} >= {1, 2}
        assert all(e["reward_error"] is None for e in episodes), [e["reward_error"] for e in episodes]
        assert all(e["tests_total"] for e in episodes), "an episode was not verified"


@pytest.mark.heavy
def test_data_parallel_learner_with_one_learner_per_node(cluster, model_path):
    """Two learners on two nodes (gloo across the veth): replicas identical after a step."""
    out = cluster.hidden / "learner_dp.json"
    job = cluster.submit([sys.executable, str(REPO / "bench" / "learner_dp.py"), "--address", "auto",
                          "--one-per-node", "--num-learners", "2", "--seq-len", "64", "--samples", "4",
                          "--steps", "1", "--json", str(out)])
    status = cluster.wait(job, 900)
    assert status == "SUCCEEDED", cluster.logs(job)[-4000:]
    result = json.loads(out.read_text())
    assert sorted(result["learner_nodes"]) == sorted([cluster.head_ip, cluster.worker_ip])
    assert result["replica_max_abs_diff"] == 0.0
    assert result["group_vs_single_max_abs_diff"] < 1e-3  # one Adam step moves weights ~lr=1e-4 each
    assert result["loss_group"] == pytest.approx(result["loss_single"], rel=1e-4)
