"""`ray job submit` to a local head runs the same training entry point, and the job's
metrics reach the dashboard's metrics endpoint (what the dashboard's charts read)."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    ports = {"gcs": free_port(), "dashboard": free_port(), "metrics": free_port(), "agent": free_port()}
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    temp_dir = tempfile.mkdtemp(prefix="rayjob-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    subprocess.run([RAY, "start", "--head", f"--port={ports['gcs']}", "--node-ip-address=127.0.0.1",
                    f"--temp-dir={temp_dir}", f"--dashboard-agent-listen-port={ports['agent']}",
                    "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
                    f"--metrics-export-port={ports['metrics']}", "--num-cpus=4", "--disable-usage-stats"],
                   check=True, env=env, capture_output=True, timeout=180)
    try:
        yield ports, env
    finally:  # stop this head only (`ray stop` would end every Ray on the machine)
        subprocess.run(["pkill", "-9", "-f", temp_dir], timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _wait_for_jobs_api(address: str, timeout: float = 120) -> None:
    """`ray start` returns before the dashboard's job server answers."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            _get(f"{address}/api/jobs/")
            return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"the dashboard's Jobs API at {address} did not come up in {timeout} s")


def test_ray_job_submit_runs_training_and_exports_metrics(ray_head, tmp_path, model_path):
    ports, env = ray_head
    address = f"http://127.0.0.1:{ports['dashboard']}"
    run_dir = tmp_path / "run"
    _wait_for_jobs_api(address)
    for _ in range(30):  # the head's job agent registers a little after the Jobs API answers
        submit = subprocess.run(
            [RAY, "job", "submit", "--address", address, "--no-wait", "--", sys.executable, "-m", "cli.main", "train",
             str(REPO / "configs" / "length.yaml"), "ray.address=auto", f"trainer.run_dir={run_dir}",
             "trainer.steps=2", "trainer.batch_size=2", "trainer.group_size=4"],
            env=env, capture_output=True, text=True, timeout=120)
        if "No available agent" not in submit.stderr:
            break
        time.sleep(2)
    assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]
    job_id = re.search(r"raysubmit_[A-Za-z0-9]+", submit.stdout + submit.stderr).group(0)
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
