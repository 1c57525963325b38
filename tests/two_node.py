"""A real two-node Ray cluster on one machine, started with docs/cluster.md's "Several nodes"
commands as written (plus a private temp dir and CPU count), for the scale-out tests.

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

import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).parent / "ray")
DASHBOARD_PORT = 8265  # Ray's default; private to the namespaces


def readme_commands() -> dict[str, str]:
    """docs/cluster.md's cluster commands (head, worker, submit, resume), one line each."""
    text = (REPO / "docs" / "cluster.md").read_text()
    block = text.split("## Several nodes", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("RAY_AUTH_MODE=disabled ")]
    assert len(lines) == 4, f"docs/cluster.md's cluster block should hold head, worker, submit, resume: {lines}"
    return dict(zip(("head", "worker", "submit", "resume"), lines))


def as_argv(line: str, **values: str) -> list[str]:
    """A docs/cluster.md line as argv here: placeholders filled, the project's venv and checkout
    resolved, the leading RAY_AUTH_MODE (set in the environment) dropped."""
    for key, value in values.items():
        line = line.replace(key, value)
    line = (line.replace("$PWD/.venv/bin/python", sys.executable).replace(".venv/bin/ray", RAY)
            .replace("$PWD", str(REPO)))
    return shlex.split(line)[1:]


def entrypoint(line: str, **values: str) -> list[str]:
    """The command after `--` of a docs/cluster.md `ray job submit` line."""
    argv = as_argv(line, **values)
    return argv[argv.index("--") + 1:]


@functools.cache
def can_make_namespaces() -> str | None:
    """None if this host can build the cluster, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, mount namespaces)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    # root inside a container or a user namespace may still lack the right to add a netns
    probe = f"rlvr-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _check(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, f"{shlex.join(done.args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


class TwoNodeCluster:
    def __init__(self, hidden: Path, env: dict[str, str], num_cpus: int = 4):
        tag = os.getpid() % 16384  # 10.213.0.0/16 holds 16384 /30s
        prefix, first = f"10.213.{tag // 64}", (tag % 64) * 4
        self.head_ip, self.worker_ip = f"{prefix}.{first + 1}", f"{prefix}.{first + 2}"
        self.head_ns, self.worker_ns = f"rlvr-h{tag}", f"rlvr-w{tag}"
        self.hidden = Path(hidden)
        self.env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_AUTH_MODE": "disabled",
                    "PYTHONPATH": str(REPO), "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "600"}
        self.num_cpus = num_cpus
        self._worker_starts = 0
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

    def _start_nodes(self, attempts: int = 5) -> None:
        """The raylet gives its dashboard agent about 50 s to start (not configurable); on
        a loaded box that can pass, so a failed start is retried from scratch."""
        for attempt in range(attempts):
            try:
                return self._start_nodes_once()
            except AssertionError:
                if attempt == attempts - 1:
                    raise
                self._kill_all()
                shutil.rmtree(self.temp, ignore_errors=True)

    def _start_nodes_once(self) -> None:
        commands, ips = readme_commands(), {"HEAD_IP": self.head_ip, "WORKER_IP": self.worker_ip}
        private = [f"--num-cpus={self.num_cpus}", "--disable-usage-stats"]
        head = as_argv(commands["head"], **ips)
        _check(self.in_head([*head, f"--temp-dir={self.temp}/head", *private], capture_output=True, text=True,
                            timeout=900))
        self.hidden.mkdir(parents=True, exist_ok=True)
        self._start_worker(f"{self.temp}/worker")
        self._wait_for_jobs_api()

    def _start_worker(self, temp_dir: str) -> None:
        """The worker node, in a mount namespace where the head's run directory is an empty tmpfs."""
        ips = {"HEAD_IP": self.head_ip, "WORKER_IP": self.worker_ip}
        worker = shlex.join([*as_argv(readme_commands()["worker"], **ips), f"--temp-dir={temp_dir}",
                             f"--num-cpus={self.num_cpus}", "--disable-usage-stats"])
        script = f"mount -t tmpfs -o size=1m rlvr-hidden {shlex.quote(str(self.hidden))} && exec {worker}"
        _check(subprocess.run(["ip", "netns", "exec", self.worker_ns, "unshare", "--mount", "--propagation",
                               "private", "sh", "-c", script], env=self.env, capture_output=True, text=True,
                              timeout=900))

    def kill_worker_raylet(self) -> int:
        """SIGKILL the worker node's raylet (the node dies; its processes follow); its pid."""
        out = subprocess.run(["ip", "netns", "pids", self.worker_ns], capture_output=True, text=True, timeout=30)
        [pid] = [int(p) for p in out.stdout.split() if Path(f"/proc/{p}/comm").read_text().strip() == "raylet"]
        os.kill(pid, signal.SIGKILL)
        return pid

    def restart_worker(self) -> None:
        """A fresh worker node in place of one that died: what is left of it is killed by pid."""
        self._kill_ns(self.worker_ns)
        self._worker_starts += 1
        self._start_worker(f"{self.temp}/worker{self._worker_starts}")

    def close(self) -> None:
        """Kill every process in the two namespaces (all started here), then delete them."""
        self._kill_all()
        for ns in (self.head_ns, self.worker_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)

    def _kill_all(self) -> None:
        self._kill_ns(self.head_ns, self.worker_ns)

    def _kill_ns(self, *namespaces: str) -> None:
        for _ in range(3):
            pids = []
            for ns in namespaces:
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

    # ---- jobs -----------------------------------------------------------------------------
    def _wait_for_jobs_api(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                self.api("/api/jobs/")
                return
            except AssertionError:
                pass
            time.sleep(2)
        raise AssertionError(f"the Jobs API at {self.address} did not come up in {timeout} s")

    def submit(self, entrypoint: list[str]) -> str:
        for _ in range(30):  # the head's job agent registers a little after the Jobs API answers
            out = self.in_head([RAY, "job", "submit", "--address", self.address, "--no-wait", "--", *entrypoint],
                               capture_output=True, text=True, timeout=300)
            if "No available agent" not in out.stderr:
                break
            time.sleep(2)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return re.search(r"raysubmit_[A-Za-z0-9]+", out.stdout + out.stderr).group(0)

    def api(self, path: str, method: str = "GET") -> dict:
        """The Jobs REST API, called from inside the head's namespace (a bare Python: the
        `ray` CLI's start-up is slow on a loaded box)."""
        code = ("import json, sys, urllib.request as u; r = u.Request(sys.argv[1], method=sys.argv[2]); "
                "print(u.urlopen(r, timeout=60).read().decode())")
        try:
            out = self.in_head([sys.executable, "-c", code, f"{self.address}{path}", method], capture_output=True,
                               text=True, timeout=300)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"{path}: no answer in 300 s") from e
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    def status(self, job: str) -> str:
        return self.api(f"/api/jobs/{job}")["status"]

    def wait(self, job: str, timeout: float, until=None) -> str:
        """Poll until the job ends (or until() is true); returns the last status."""
        deadline = time.time() + timeout
        status = "PENDING"
        while time.time() < deadline:
            try:
                status = self.status(job)
            except AssertionError:  # a dashboard too busy to answer once is not a failed job
                time.sleep(10)
                continue
            if status in ("SUCCEEDED", "FAILED", "STOPPED") or (until is not None and until()):
                return status
            time.sleep(3)
        raise AssertionError(f"job {job} still {status} after {timeout} s:\n{self.logs(job)[-3000:]}")

    def stop(self, job: str) -> None:
        assert self.api(f"/api/jobs/{job}/stop", "POST")["stopped"], f"job {job} was not running"

    def logs(self, job: str) -> str:
        return self.api(f"/api/jobs/{job}/logs")["logs"]
