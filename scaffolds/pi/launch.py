"""Where pi runs: a host process group (development) or the episode's sandbox; and the
/proc scan that finds every process an episode left behind."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import urlsplit, urlunsplit

from envs.sandbox import chown_tree, sandbox_python_dir
from rl.paths import rlvr_home
from scaffolds import socket_forward
from scaffolds.pi.install import PI_GUARD
from scaffolds.socket_forward import UnixToTcp

MARKER_ENV = "RLVR_EPISODE_MARKER"  # tags every process of one episode, so none can be missed at cleanup


class Launcher(Protocol):
    """Where pi runs. `start` returns a process whose stdout is pi's event stream; `guard` is
    scaffolds/pi/pi_guard.js as pi sees it."""
    guard: str

    def prepare(self, work: Path, base_url: str) -> tuple[Path, str, str]:
        """Set up the episode's private dir; return (config dir on the host, the same dir as pi
        sees it, base_url as pi must call it)."""
        ...

    def start(self, argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> subprocess.Popen: ...

    def stop(self, proc: subprocess.Popen) -> None: ...

    def cleanup(self) -> None: ...


class HostLauncher:
    """pi as a plain process group on the host, cwd = checkout. Development and tests only:
    nothing confines what the agent runs."""
    guard = str(PI_GUARD)

    def __init__(self, checkout: str | Path, grace_s: float = 2.0):
        self.checkout = Path(checkout)
        self.grace_s = grace_s
        self._marker = ""

    def prepare(self, work, base_url):
        return work / "agent", str(work / "agent"), base_url

    def start(self, argv, env, stderr):
        self._marker = env[MARKER_ENV]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": env["PI_CODING_AGENT_DIR"],
               "LANG": "C.UTF-8", **env}
        return subprocess.Popen(argv, cwd=self.checkout, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)

    def stop(self, proc):
        # SIGTERM first: pi then ends its bash children (they run in their own groups);
        # SIGKILL would orphan them, so stragglers are found by the episode marker.
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        self.cleanup()

    def cleanup(self):
        if self._marker:
            for pid in pids_with_marker(self._marker):
                _signal_pid(pid, signal.SIGKILL)


INSIDE_RUN = "/run/rlvr"              # the episode's private dir inside the sandbox
INSIDE_FORWARDER = "/run/rlvr-forward.py"
INSIDE_GUARD = "/run/rlvr-pi-guard.js"
INSIDE_PORT = 18080                   # the sandbox has its own network namespace: no clashes


class SandboxLauncher:
    """pi inside the episode's sandbox (checkout at /repo, unprivileged uid, no network).

    The policy server is reached through a unix socket in the episode dir (bound at /run/rlvr)
    and a forwarder that listens on 127.0.0.1:INSIDE_PORT inside the sandbox and starts pi.
    Killing the sandbox's process group collapses its pid namespace: nothing survives.
    """
    guard = INSIDE_GUARD

    def __init__(self, sandbox, cpu_s: int | None = None):
        self.sandbox = sandbox
        self.cpu_s = cpu_s
        self._work: Path | None = None
        self._bridge: UnixToTcp | None = None

    def prepare(self, work, base_url):
        parsed = urlsplit(base_url)
        if parsed.scheme != "http" or parsed.hostname is None:
            raise ValueError(f"policy server URL {base_url!r} must be http://host:port/...")
        run_dir = work / "run"
        run_dir.mkdir()
        config_dir = run_dir / "agent"
        config_dir.mkdir()
        self._work = run_dir
        self._bridge = UnixToTcp(str(run_dir / "policy.sock"), parsed.hostname,
                                 parsed.port or 80).start()
        inside_url = urlunsplit(("http", f"127.0.0.1:{INSIDE_PORT}", parsed.path, parsed.query, ""))
        return config_dir, f"{INSIDE_RUN}/agent", inside_url

    def start(self, argv, env, stderr):
        assert self._work is not None, "prepare() first"
        chown_tree(self._work, self.sandbox.uid)  # pi writes into its agent dir
        os.chown(self._work / "policy.sock", 0, 0)  # the socket stays root's (mode 0666)
        inner = [str(sandbox_python_dir() / "bin" / "python"), INSIDE_FORWARDER,
                 "--unix", f"{INSIDE_RUN}/policy.sock", "--port", str(INSIDE_PORT), "--", *argv]
        pi_home = str(rlvr_home() / "pi")
        return self.sandbox.popen(
            inner, env=env, memory_mib=0, cpu_s=self.cpu_s,
            extra_ro_binds=[(pi_home, pi_home), (socket_forward.__file__, INSIDE_FORWARDER),
                            (str(PI_GUARD), INSIDE_GUARD)],
            extra_rw_binds=[(str(self._work), INSIDE_RUN)],
            stdout=subprocess.PIPE, stderr=stderr)

    def stop(self, proc):
        # Sandbox.kill would also close stdout under the reader thread; the group kill is the
        # same: bwrap's death collapses the sandbox's pid namespace.
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()

    def cleanup(self):
        if self._bridge is not None:
            self._bridge.close()
            self._bridge = None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def pids_with_marker(marker: str) -> list[int]:
    """Live processes whose environment carries this episode's marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
