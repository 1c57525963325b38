"""A real two-node Ray cluster on one machine, for the scale-out tests.

The head and the worker node each live in their own network namespace, joined by a veth
pair with a /30 of their own (10.213.N.0/30, N from this process's id, so concurrent runs
do not share addresses). The worker node also runs in a mount namespace where `hidden`
(the head's run directory) is an empty tmpfs: anything that still needs a shared
filesystem fails there. Everything is torn down on exit, failure included: the processes
inside the two namespaces are killed by pid, then the namespaces are deleted.

    with TwoNodeCluster(hidden=tmp_path / "head", env=env) as c:
        job = c.submit([...])
        c.wait(job)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).parent / "ray")
GCS_PORT, DASHBOARD_PORT = 6379, 8265  # private to the namespaces


def can_make_namespaces() -> str | None:
    """None if this host can build the cluster, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, mount namespaces)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class TwoNodeCluster:
    def __init__(self, hidden: Path, env: dict[str, str], head_resources: dict, worker_resources: dict,
                 num_cpus: int = 4):
        tag = os.getpid() % 16384  # 10.213.0.0/16 holds 16384 /30s
        prefix, first = f"10.213.{tag // 64}", (tag % 64) * 4
        self.head_ip, self.worker_ip = f"{prefix}.{first + 1}", f"{prefix}.{first + 2}"
        self.head_ns, self.worker_ns = f"rlvr-h{tag}", f"rlvr-w{tag}"
        self.hidden = Path(hidden)
        self.env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_AUTH_MODE": "disabled",
                    "PYTHONPATH": str(REPO)}
        self.head_resources, self.worker_resources = head_resources, worker_resources
        self.num_cpus = num_cpus
        self.temp = tempfile.mkdtemp(prefix="r2n-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        self.address = f"http://{self.head_ip}:{DASHBOARD_PORT}"

    # ---- set-up / tear-down ---------------------------------------------------------------
    def __enter__(self) -> "TwoNodeCluster":
        try:
            self._network()
            self._start_nodes()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    def _network(self) -> None:
        h, w = self.head_ns, self.worker_ns
        self._ip("netns", "add", h)
        self._ip("netns", "add", w)
        self._ip("link", "add", f"v{h}", "type", "veth", "peer", "name", f"v{w}")
        for ns, ip in ((h, self.head_ip), (w, self.worker_ip)):
            self._ip("link", "set", f"v{ns}", "netns", ns)
            self._ip("-n", ns, "addr", "add", f"{ip}/30", "dev", f"v{ns}")
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "link", "set", f"v{ns}", "up")

    def in_head(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.head_ns, *argv], env=self.env, **kw)

    def _start_nodes(self) -> None:
        common = [f"--num-cpus={self.num_cpus}", "--disable-usage-stats"]
        self.in_head([RAY, "start", "--head", f"--node-ip-address={self.head_ip}", f"--port={GCS_PORT}",
                      f"--temp-dir={self.temp}/head", "--include-dashboard=true", f"--dashboard-host={self.head_ip}",
                      f"--dashboard-port={DASHBOARD_PORT}", f"--resources={json.dumps(self.head_resources)}",
                      *common], check=True, capture_output=True, timeout=300)
        self.hidden.mkdir(parents=True, exist_ok=True)
        # The worker's mount namespace: the head's run directory is an empty tmpfs there.
        script = (f"mount -t tmpfs -o size=1m rlvr-hidden {self.hidden} && exec {RAY} start "
                  f"--address={self.head_ip}:{GCS_PORT} --node-ip-address={self.worker_ip} "
                  f"--temp-dir={self.temp}/worker --resources='{json.dumps(self.worker_resources)}' "
                  + " ".join(common))
        subprocess.run(["ip", "netns", "exec", self.worker_ns, "unshare", "--mount", "--propagation", "private",
                        "sh", "-c", script], env=self.env, check=True, capture_output=True, timeout=300)
        self._wait_for_jobs_api()

    def close(self) -> None:
        """Kill every process in the two namespaces (all started here), then delete them."""
        for _ in range(3):
            pids = []
            for ns in (self.head_ns, self.worker_ns):
                out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
                pids += [int(p) for p in out.stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(1)
        for ns in (self.head_ns, self.worker_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)

    # ---- jobs -----------------------------------------------------------------------------
    def _wait_for_jobs_api(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            probe = self.in_head([RAY, "job", "list", "--address", self.address], capture_output=True, timeout=60)
            if probe.returncode == 0:
                return
            time.sleep(2)
        raise AssertionError(f"the Jobs API at {self.address} did not come up in {timeout} s")

    def submit(self, entrypoint: list[str]) -> str:
        for _ in range(30):  # the head's job agent registers a little after the Jobs API answers
            out = self.in_head([RAY, "job", "submit", "--address", self.address, "--no-wait", "--", *entrypoint],
                               capture_output=True, text=True, timeout=120)
            if "No available agent" not in out.stderr:
                break
            time.sleep(2)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return re.search(r"raysubmit_[A-Za-z0-9]+", out.stdout + out.stderr).group(0)

    def status(self, job: str) -> str:
        out = self.in_head([RAY, "job", "status", "--address", self.address, job], capture_output=True,
                           text=True, timeout=60)
        return next((s for s in ("SUCCEEDED", "FAILED", "STOPPED", "RUNNING", "PENDING") if s in out.stdout),
                    "UNKNOWN")

    def wait(self, job: str, timeout: float, until=None) -> str:
        """Poll until the job ends (or until() is true); returns the last status."""
        deadline = time.time() + timeout
        status = "PENDING"
        while time.time() < deadline:
            status = self.status(job)
            if status in ("SUCCEEDED", "FAILED", "STOPPED") or (until is not None and until()):
                return status
            time.sleep(3)
        raise AssertionError(f"job {job} still {status} after {timeout} s:\n{self.logs(job)[-3000:]}")

    def stop(self, job: str) -> None:
        self.in_head([RAY, "job", "stop", "--address", self.address, job], capture_output=True, timeout=120)

    def logs(self, job: str) -> str:
        return self.in_head([RAY, "job", "logs", "--address", self.address, job], capture_output=True,
                            text=True, timeout=60).stdout
