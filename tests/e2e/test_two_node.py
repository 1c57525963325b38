"""Scale-out on a real two-node Ray cluster (tests/fixtures/two_node.py: network namespaces, a veth
pair, and a worker node that cannot see the head's run directory). Jobs go through
`ray job submit`; actors are pinned to nodes by custom resources; one run is killed
mid-step and resumed with its learner on the node without the checkpoints.

With TWO_NODE_RECORD=<folder> each run's metrics rows, actor placement and job times are
also written there (docs/results/two-node/ holds such a record)."""
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from orchestrator.checkpoint import latest_checkpoint
from orchestrator.metrics import read_metrics
from rl.config import load_config
from tests.fixtures.two_node import REPO, TwoNodeCluster, can_make_namespaces, entrypoint, readme_commands

pytestmark = pytest.mark.skipif(can_make_namespaces() is not None, reason=str(can_make_namespaces()))

TRAIN = [sys.executable, "-m", "cli.main", "train"]
RECORD = os.environ.get("TWO_NODE_RECORD")


def record(name: str, cluster: TwoNodeCluster, **data) -> None:
    """Keep a run's record under TWO_NODE_RECORD, if set."""
    if RECORD:
        Path(RECORD).mkdir(parents=True, exist_ok=True)
        nodes = {"head": cluster.head_ip, "worker": cluster.worker_ip}
        (Path(RECORD) / f"{name}.json").write_text(json.dumps({"nodes": nodes, **data}, indent=1) + "\n")


def run_job(cluster: TwoNodeCluster, entry: list[str], timeout: float, until=None) -> tuple[str, str, float]:
    """Submit, wait; returns the job id, its last status and its wall time."""
    t0 = time.time()
    job = cluster.submit(entry)
    return job, cluster.wait(job, timeout, until=until), time.time() - t0


def placed(**roles: str) -> list[str]:
    """Overrides pinning each role to the node kind named (head/worker), replacing any pin."""
    return [f"ray.role_resources.{role}={{{node}_node: 1}}" for role, node in roles.items()]


def check_run(run_dir: Path, cluster: TwoNodeCluster, steps: int, synced: bool = False, **roles: str) -> list[dict]:
    """No step lost or repeated, the parity probe under its threshold after every step, each
    actor on its node; with synced, every step trained and shipped new weights."""
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), "a step was lost or repeated"
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.sync.transport == "object_store"
    ips = {"head": cluster.head_ip, "worker": cluster.worker_ip}
    for m in metrics:
        assert m["parity_gap"] < cfg.sync.parity_threshold
        if synced:
            assert m["loss"] is not None and m["train_samples"] > 0, f"step {m['step']} did not update and sync"
        for role, node in roles.items():
            assert m["nodes"][f"{role}/0"] == ips[node], (role, m["nodes"])
    return metrics


def kill_mid_step_and_resume(cluster: TwoNodeCluster, entry: list[str], run_dir: Path, timeout: float) -> dict:
    """Run until step 1 is checkpointed (step 2 under way), stop the job, resume it with the
    resume command of docs/cluster.md; returns the two jobs' wall times and the resume line. (The step's
    metrics record is written just before its checkpoint: stopping on the record alone could
    land before any checkpoint exists, and the "resume" would start over.)"""
    job, status, first_s = run_job(cluster, entry, timeout,
                                   until=lambda: (latest_checkpoint(run_dir) or (0,))[0] >= 1)
    assert status == "RUNNING", cluster.logs(job)[-4000:]
    cluster.stop(job)
    assert [m["step"] for m in read_metrics(run_dir)] == [1]
    resume = entrypoint(readme_commands()["resume"], **{"$PWD/runs/cluster": str(run_dir)})
    resumed, status, resumed_s = run_job(cluster, resume, timeout)
    logs = cluster.logs(resumed)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "resumed from" in logs and "continuing at step 2" in logs
    resumed_line = next(line for line in logs.splitlines() if "resumed from" in line)
    return {"killed_job_s": first_s, "resumed_job_s": resumed_s, "resumed": resumed_line.strip()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with TwoNodeCluster(hidden=tmp_path_factory.mktemp("head"), env=dict(os.environ)) as c:
        yield c


@pytest.mark.parametrize("strategy", ["lora", pytest.param("merged", marks=pytest.mark.heavy)])
def test_length_run_with_the_learner_on_a_node_without_the_run_dir(cluster, model_path, strategy):
    """Rollout worker on the head, learner on the worker node: every step's weights (the
    LoRA adapter, or the merged tensors), the checkpoint and its restore all cross nodes
    through Ray; killed mid-step, resumed. The LoRA case (~2 min) is in the default suite."""
    run_dir = cluster.hidden / f"length-{strategy}"
    entry = [*TRAIN, str(REPO / "configs" / "length.yaml"), "ray.address=auto", f"trainer.run_dir={run_dir}",
             "trainer.steps=2", "trainer.batch_size=2", "trainer.group_size=4", "ray.placement_strategy=SPREAD",
             f"sync.strategy={strategy}", *placed(rollout="head", learner="worker")]
    times = kill_mid_step_and_resume(cluster, entry, run_dir, timeout=900)
    metrics = check_run(run_dir, cluster, 2, synced=True, rollout="head", learner="worker")
    record(f"length-{strategy}-learner-on-worker", cluster, entrypoint=entry, **times, metrics=metrics)
    assert (run_dir / "checkpoints" / "step_000002" / "learner" / "adapter" / "adapter_model.safetensors").is_file()
    assert_logged_from(run_dir, "learner-0", cluster.worker_ip)
    assert_logged_from(run_dir, "rollout-0", cluster.head_ip)


def assert_logged_from(run_dir: Path, actor: str, ip: str) -> str:
    """The actor's log is in the head's run directory, written (also) by the actor on `ip`
    (the worker node cannot see that directory: its lines came through the log sink)."""
    log = run_dir / "logs" / f"{actor}.log"
    assert log.is_file(), sorted(p.name for p in (run_dir / "logs").glob("*"))
    text = log.read_text(errors="replace")
    assert f"[rlvr] {actor} on node {ip} " in text, text[:2000]
    return text


def test_a_worker_node_that_dies_fails_the_run_naming_its_actors(cluster, model_path):
    """The worker's raylet is killed mid-run (step 1 checkpointed): the job fails with the
    learner's name, "node died", and the resume command, and the learner's log (from the dead
    node) is in the head's run directory. The worker node is started again afterwards."""
    run_dir = cluster.hidden / "node-dies"
    entry = [*TRAIN, str(REPO / "configs" / "length.yaml"), "ray.address=auto", f"trainer.run_dir={run_dir}",
             "trainer.steps=3", "trainer.batch_size=2", "trainer.group_size=4", "ray.placement_strategy=SPREAD",
             *placed(rollout="head", learner="worker")]
    try:
        job, status, _ = run_job(cluster, entry, 900, until=lambda: (latest_checkpoint(run_dir) or (0,))[0] >= 1)
        assert status == "RUNNING", cluster.logs(job)[-4000:]
        cluster.kill_worker_raylet()
        t0 = time.time()
        status = cluster.wait(job, 300)
        failed_s = time.time() - t0
        logs = cluster.logs(job)
        assert status == "FAILED", logs[-4000:]
        assert re.search(rf"node died during step \d: learner-0 on {re.escape(cluster.worker_ip)} went with it",
                         logs), logs[-4000:]
        assert f"rlvr train --resume {run_dir}" in logs, logs[-4000:]
        learner_log = assert_logged_from(run_dir, "learner-0", cluster.worker_ip)
        assert "learner-0.log (last" in logs, "the failure tail shows the dead node's actor log"
        line = next(x for x in logs.splitlines() if "node died during step" in x)
        record("node-dies", cluster, entrypoint=entry, failed_after_kill_s=failed_s, error=line.strip(),
               learner_log_lines=len(learner_log.splitlines()))
    finally:
        cluster.restart_worker()


@pytest.mark.heavy
def test_coding_runs_with_env_actors_and_pi_on_the_worker_node(cluster, model_path):
    """The submit command of docs/cluster.md (2 GRPO steps of the pi coding config, environment actors
    and pi on the worker node, rollout + learner on the head), then the same with the
    learner on the worker node, killed mid-step and resumed. A step whose episodes all score
    alike skips the update and its sync; the resume always syncs (merged, across nodes), and
    the length cases above sync every step."""
    small = ["trainer.steps=2", "trainer.batch_size=1", "trainer.group_size=2", "scaffold.max_turns=2",
             "scaffold.wall_clock_s=600", "rollout.max_tokens=96"]

    def readme_run(run_dir: Path) -> list[str]:
        return [*entrypoint(readme_commands()["submit"], HEAD_IP=cluster.head_ip,
                            **{"$PWD/runs/cluster": str(run_dir)}), *small]

    first = cluster.hidden / "coding-a"
    job, status, job_s = run_job(cluster, readme_run(first), 1800)
    assert status == "SUCCEEDED", cluster.logs(job)[-4000:]
    runs = {"coding-learner-on-head": (first, readme_run(first), {"job_s": job_s},
                                       check_run(first, cluster, 2, rollout="head", learner="head", env="worker"))}

    second = cluster.hidden / "coding-b"
    entry = [*readme_run(second), *placed(learner="worker")]
    times = kill_mid_step_and_resume(cluster, entry, second, 1800)
    runs["coding-learner-on-worker"] = (second, entry, times,
                                        check_run(second, cluster, 2, rollout="head", learner="worker", env="worker"))
    for name, (run, entry, times, metrics) in runs.items():
        episodes = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
        assert {e["step"] for e in episodes} >= {1, 2}
        assert all(e["reward_error"] is None for e in episodes), [e["reward_error"] for e in episodes]
        assert all(e["tests_total"] for e in episodes), "an episode was not verified"
        keys = ("step", "task", "reward", "tests_passed", "tests_total", "turns", "stop_reason")
        scored = [{k: e.get(k) for k in keys} for e in episodes]
        record(name, cluster, entrypoint=entry, **times, metrics=metrics, episodes=scored)


@pytest.mark.heavy
def test_data_parallel_learner_with_one_learner_per_node(cluster, model_path):
    """Two learners on two nodes (gloo across the veth): replicas identical after a step."""
    out = cluster.hidden / "learner_dp.json"
    entry = [sys.executable, "-m", "bench.learner_dp", "--address", "auto", "--one-per-node",
             "--num-learners", "2", "--seq-len", "64", "--samples", "4", "--steps", "1", "--json", str(out)]
    job, status, job_s = run_job(cluster, entry, 900)
    assert status == "SUCCEEDED", cluster.logs(job)[-4000:]
    result = json.loads(out.read_text())
    record("learner-dp-one-per-node", cluster, entrypoint=entry, job_s=job_s, result=result)
    assert sorted(result["learner_nodes"]) == sorted([cluster.head_ip, cluster.worker_ip])
    assert result["replica_max_abs_diff"] == 0.0
    assert result["group_vs_single_max_abs_diff"] < 1e-3  # one Adam step moves weights ~lr=1e-4 each
    assert result["loss_group"] == pytest.approx(result["loss_single"], rel=1e-4)
