"""`ray job submit` to a local head runs the same training entry point, and the job's
metrics reach the dashboard's metrics endpoint (what the dashboard's charts read)."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    ports = {"gcs": free_port(), "dashboard": free_port(), "metrics": free_port()}
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    subprocess.run([RAY, "start", "--head", f"--port={ports['gcs']}", "--node-ip-address=127.0.0.1",
                    "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
                    f"--metrics-export-port={ports['metrics']}", "--num-cpus=4", "--disable-usage-stats"],
                   check=True, env=env, capture_output=True, timeout=180)
    try:
        yield ports, env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_ray_job_submit_runs_training_and_exports_metrics(ray_head, tmp_path, model_path):
    ports, env = ray_head
    address = f"http://127.0.0.1:{ports['dashboard']}"
    run_dir = tmp_path / "run"
    submit = subprocess.run(
        [RAY, "job", "submit", "--address", address, "--no-wait", "--", sys.executable, "-m", "rl.cli", "train",
         str(REPO / "configs" / "length.yaml"), "ray.address=auto", f"trainer.run_dir={run_dir}",
         "trainer.steps=2", "trainer.batch_size=2", "trainer.group_size=4"],
        env=env, capture_output=True, text=True, timeout=120, check=True)
    job_id = next(w for w in submit.stdout.split() if w.startswith("raysubmit_"))
    seen_metric = False
    deadline = time.time() + 900
    status = "PENDING"
    while time.time() < deadline:
        status = json.loads(_get(f"{address}/api/jobs/{job_id}"))["status"]
        seen_metric = seen_metric or "ray_rlvr_reward_mean" in _get(f"http://127.0.0.1:{ports['metrics']}/metrics")
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(3)
    logs = subprocess.run([RAY, "job", "logs", "--address", address, job_id], env=env,
                          capture_output=True, text=True, timeout=60).stdout
    assert status == "SUCCEEDED", logs[-4000:]
    assert "[step 2/2" in logs
    assert [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    for _ in range(10):  # the metrics agent exports on an interval
        seen_metric = seen_metric or "ray_rlvr_reward_mean" in _get(f"http://127.0.0.1:{ports['metrics']}/metrics")
        if seen_metric:
            break
        time.sleep(2)
    assert seen_metric, "rlvr_* metrics never reached the node's metrics endpoint"
