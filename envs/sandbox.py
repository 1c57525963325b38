"""Run untrusted commands confined: no network, one writable directory, an unprivileged uid,
rlimits and a wall clock, and nothing left running afterwards.

The recipe (measured to hold on this project's machines): the host process is root; it drops
to an unprivileged uid with `setpriv`, applies rlimits with `prlimit`, then `bwrap` builds
a fresh mount/pid/net/ipc/uts/user namespace with read-only system directories, the
world-readable sandbox Python, a private /tmp and a read-write bind of the checkout.
bwrap started as root is escapable (it can remount read-write), hence the uid drop first.
Killing the sandbox's pid 1 (bwrap's init) makes the kernel kill every process left in its
pid namespace, even ones that called setsid. The sandbox is ended from the inside out (its
processes first, then bwrap, which reaps its own pid 1), and the host process is a child
subreaper that reaps whatever is orphaned anyway: an unreaped zombie still counts against
the uid's RLIMIT_NPROC, and a container's init may never reap it. A seccomp filter denies
ptrace and cross-process memory access inside, so nothing can stop or steer the pid 1.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envs.procs import (  # noqa: F401  (re-exported)
    _seccomp_fd,
    _spawn,
    kill_sandboxed,
    kill_uid,
    processes_of_uid,
    reap_orphans,
    seccomp_program,
    stopped_processes,
)
from rl.paths import rlvr_home

INSIDE_REPO = "/repo"           # where the checkout appears inside the sandbox
INSIDE_TMP = "/tmp"
INSIDE_SITE = "/rlvr/site"      # a task's test-dependency overlay (envs/testdeps.py), on PYTHONPATH
_MIB = 1024 * 1024
STOPPED_TICKS = 2               # quiet seconds with a stopped process before a run is ended
_ARGV_COMMAND_MAX = 100_000     # bytes of a command passed as bash -c's argument

# Read-only system paths every sandbox sees. /etc is not bound whole: only what programs
# need to start; /etc/shadow and friends simply do not exist inside.
_RO_SYSTEM = ["/usr"]
_ETC_FILES = ["/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/ld.so.cache",
              "/etc/localtime", "/etc/alternatives", "/etc/mime.types"]


# the environment setpriv, prlimit and bwrap start with (bwrap's pid 1 keeps it; the command
# inside gets only what `--setenv` gives it)
_HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


class SandboxUnavailable(RuntimeError):
    """The host cannot sandbox (missing bwrap/setpriv, not root, no user namespaces)."""


def sandbox_python_dir() -> Path:
    return rlvr_home() / "sandbox-venv"


@dataclass
class Limits:
    cpu_s: int = 60                 # RLIMIT_CPU per command (seconds of CPU)
    memory_mib: int = 2048          # RLIMIT_AS
    max_processes: int = 64         # RLIMIT_NPROC (per uid: give each environment its own uid)
    max_file_mib: int = 64          # RLIMIT_FSIZE
    tmp_mib: int = 256              # size of a private tmpfs /tmp when no tmp_dir is bound
    max_output_bytes: int = 64 * _MIB  # a command printing more than this is killed
    nice: int = 0                   # niceness of everything inside (agent, commands, tests): an engine
                                    # on the same host keeps its cores (bench/host_contention.py)


@dataclass
class CommandResult:
    exit_code: int                  # -N: killed by signal N; 124: the wall clock ran out; -19: stopped
    output: str                     # stdout+stderr merged; the tail when truncated
    timed_out: bool
    truncated: bool
    seconds: float
    total_output_bytes: int = 0
    output_limit_hit: bool = False
    stopped: bool = False           # a process of it stopped itself and it was ended (the output says which)


@dataclass
class Sandbox:
    """One confined place to run commands.

    workdir: host directory bound read-write at /repo (cwd of every command), or read-only
    with `workdir_readonly=True`. tmp_dir: host directory bound at /tmp (put it under the same
    size-limited mount as the checkout); None gives a private tmpfs of `limits.tmp_mib`.
    uid: the unprivileged uid commands run as; files the sandbox must write have to be owned
    by it (see `chown_tree`).

    Interfaces:
      run(command, timeout_s) -> CommandResult            # bash -c, merged output, tail-truncated
      run_argv(argv, timeout_s, env=..., pass_fds=...) -> CommandResult
      popen(argv, env=..., extra_ro_binds=[(host, inside)], extra_rw_binds=[...],
            share_net=False, memory_mib=None, **popen_kwargs) -> subprocess.Popen
          # long-running process (e.g. the pi agent); new process group; end it with
          # Sandbox.kill(proc). Node (/usr/bin/node) is inside /usr already; bind pi with
          # extra_ro_binds=[(str(rlvr_home() / "pi"), str(rlvr_home() / "pi"))].
    """
    workdir: Path
    uid: int = 65534
    limits: Limits = field(default_factory=Limits)
    tmp_dir: Path | None = None
    workdir_readonly: bool = False
    max_output_chars: int = 50_000
    site_overlay: Path | None = None   # read-only extra site directory (a library's test dependencies)

    def __post_init__(self) -> None:
        check_host()
        self.workdir = Path(self.workdir)

    # --- building the command line -------------------------------------------------------
    def argv(self, env: Mapping[str, str] | None = None, extra_ro_binds: Sequence[tuple[str, str]] = (),
             extra_rw_binds: Sequence[tuple[str, str]] = (), share_net: bool = False,
             memory_mib: int | None = None, cpu_s: int | None = None,
             seccomp_fd: int | None = None) -> tuple[list[str], list[str]]:
        """(setpriv ... bwrap, bwrap's options); the command follows them after `--`."""
        lim = self.limits
        mem = lim.memory_mib if memory_mib is None else memory_mib
        cpu = lim.cpu_s if cpu_s is None else cpu_s
        head = ["nice", "-n", str(lim.nice)] if lim.nice else []   # inherited; unprivileged, it can only rise
        head += ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                "prlimit", f"--cpu={cpu}:{cpu + 1}", f"--nproc={lim.max_processes}",
                f"--fsize={lim.max_file_mib * _MIB}", "--core=0", "--nofile=1024"]
        if mem > 0:
            head.append(f"--as={mem * _MIB}")
        head += ["--", "bwrap"]
        cmd = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
               "--cap-drop", "ALL"]
        if share_net:
            cmd.append("--share-net")
        if seccomp_fd is not None:
            cmd += ["--seccomp", str(seccomp_fd)]
        for p in _RO_SYSTEM:
            cmd += ["--ro-bind", p, p]
        for link, target in (("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64"),
                             ("/sbin", "usr/sbin")):
            cmd += ["--symlink", target, link]
        for f in _ETC_FILES:
            if os.path.exists(f):
                cmd += ["--ro-bind", f, f]
        py = str(sandbox_python_dir())
        cmd += ["--ro-bind", py, py, "--proc", "/proc", "--dev", "/dev"]
        if self.tmp_dir is not None:
            cmd += ["--bind", str(self.tmp_dir), INSIDE_TMP]
        else:
            cmd += ["--size", str(lim.tmp_mib * _MIB), "--tmpfs", INSIDE_TMP]
        cmd += ["--ro-bind" if self.workdir_readonly else "--bind", str(self.workdir), INSIDE_REPO]
        if self.site_overlay is not None:
            cmd += ["--ro-bind", str(self.site_overlay), INSIDE_SITE]
        for host, inside in extra_ro_binds:
            cmd += ["--ro-bind", str(host), str(inside)]
        for host, inside in extra_rw_binds:
            cmd += ["--bind", str(host), str(inside)]
        # the root is bwrap's own tmpfs (in RAM, unbounded): read-only, so it can't fill memory
        cmd += ["--remount-ro", "/", "--chdir", INSIDE_REPO, "--clearenv"]
        full_env = {"PATH": f"{py}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": INSIDE_TMP,
                    "TMPDIR": INSIDE_TMP, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                    "PYTHONUNBUFFERED": "1"}
        full_env.update(env or {})
        if self.site_overlay is not None:   # after the verifier's plugin: the overlay cannot shadow it
            full_env["PYTHONPATH"] = ":".join(filter(None, [full_env.get("PYTHONPATH"), INSIDE_SITE]))
        for k, v in full_env.items():
            cmd += ["--setenv", k, v]
        return head, cmd

    def _start(self, inner: Sequence[str], pass_fds: Sequence[int] = (), env: Mapping[str, str] | None = None,
               extra_ro_binds: Sequence[tuple[str, str]] = (), extra_rw_binds: Sequence[tuple[str, str]] = (),
               share_net: bool = False, memory_mib: int | None = None, cpu_s: int | None = None,
               **popen_kwargs) -> subprocess.Popen:
        """Spawn the confined command in a new session. bwrap's options (every host path bound,
        the command's environment) reach it through a file descriptor (`--args`), and it starts
        with a bare environment: bwrap stays the sandbox's pid 1, whose command line and
        environment any process inside can read (`ps`), and neither may show a host path."""
        filt = _seccomp_fd()
        head, options = self.argv(env, extra_ro_binds, extra_rw_binds, share_net, memory_mib, cpu_s, filt)
        opts = _args_fd(options)
        try:
            proc = _spawn([*head, "--args", str(opts), "--", *inner], env=_HOST_ENV, start_new_session=True,
                          pass_fds=(*pass_fds, opts, *((filt,) if filt is not None else ())), **popen_kwargs)
        finally:
            os.close(opts)
            if filt is not None:
                os.close(filt)
        proc.sandbox_uid = self.uid  # lets Sandbox.kill wait until the sandbox is really empty
        return proc

    # --- running ---------------------------------------------------------------------
    def run(self, command: str, timeout_s: float) -> CommandResult:
        """Run `bash -c command` in the checkout; never raises for what the command does.

        A command too long for one argv string (Linux: 128 KiB) is read by bash from an
        inherited file instead."""
        script = command.encode("utf-8", "surrogateescape")
        if len(script) <= _ARGV_COMMAND_MAX:
            return self.run_argv(["bash", "-c", command], timeout_s)
        fd = os.memfd_create("rlvr-command", 0)
        try:
            os.write(fd, script)
            os.lseek(fd, 0, os.SEEK_SET)
            return self.run_argv(["bash", f"/dev/fd/{fd}"], timeout_s, pass_fds=(fd,))
        finally:
            os.close(fd)

    def run_argv(self, inner: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None,
                 pass_fds: Sequence[int] = (), extra_ro_binds: Sequence[tuple[str, str]] = (),
                 max_output_chars: int | None = None) -> CommandResult:
        cap = self.max_output_chars if max_output_chars is None else max_output_chars
        start = time.monotonic()
        proc = self._start(inner, pass_fds, env=env, extra_ro_binds=extra_ro_binds,
                           cpu_s=max(1, int(timeout_s) + 1) if timeout_s < self.limits.cpu_s else None,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        tail = bytearray()
        total = 0
        timed_out = limit_hit = stopped = False
        stopped_ticks = 0
        deadline = start + timeout_s
        fd = proc.stdout.fileno()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
                if not ready:   # quiet: a process that stopped itself is ended now, not at the deadline
                    halted = stopped_processes(self.uid)
                    stopped_ticks = stopped_ticks + 1 if halted else 0
                    if stopped_ticks >= STOPPED_TICKS:
                        stopped = True
                        tail += stopped_note(halted, time.monotonic() - start).encode()
                        break
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                total += len(chunk)
                tail += chunk
                if len(tail) > 4 * cap + 4096:   # bytes >= chars; trim lazily
                    del tail[: len(tail) - (4 * cap + 4096)]
                if total > self.limits.max_output_bytes:
                    limit_hit = True
                    break
        finally:
            self.kill(proc)
        exit_code = 124 if timed_out else -signal.SIGSTOP if stopped else proc.returncode
        text = tail.decode("utf-8", errors="replace")
        truncated = total > len(tail) or len(text) > cap
        if len(text) > cap:
            text = text[-cap:]
        return CommandResult(exit_code=exit_code, output=text, timed_out=timed_out,
                             truncated=truncated, seconds=time.monotonic() - start,
                             total_output_bytes=total, output_limit_hit=limit_hit, stopped=stopped)

    def popen(self, inner: Sequence[str], env: Mapping[str, str] | None = None,
              extra_ro_binds: Sequence[tuple[str, str]] = (),
              extra_rw_binds: Sequence[tuple[str, str]] = (),
              share_net: bool = False, memory_mib: int | None = None,
              cpu_s: int | None = None, **popen_kwargs) -> subprocess.Popen:
        """Start a long-running confined process in its own process group.

        The caller owns it and must end it with `Sandbox.kill(proc)`. Node reserves large
        virtual memory: pass memory_mib=0 (no RLIMIT_AS) for pi.
        """
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        return self._start(inner, popen_kwargs.pop("pass_fds", ()), env=env, extra_ro_binds=extra_ro_binds,
                           extra_rw_binds=extra_rw_binds, share_net=share_net, memory_mib=memory_mib,
                           cpu_s=cpu_s, **popen_kwargs)

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        """SIGKILL the process group; bwrap's death collapses the sandbox's pid namespace.
        Then wait until the sandbox is empty and its orphaned pid 1 is reaped."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        if getattr(proc, "sandbox_uid", None) is not None:
            kill_sandboxed(proc.sandbox_uid)
        if proc.stdout is not None:
            proc.stdout.close()

    def kill_uid_leftovers(self) -> int:
        """Kill any process still running as this sandbox's uid (belt and braces); count them."""
        return kill_uid(self.uid)


def stopped_note(pids: Sequence[int], after_s: float) -> str:
    """The line a stopped command's output ends with: which processes, and why it was ended."""
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except (FileNotFoundError, ProcessLookupError):
            names.append("exited")
    return (f"\n[the command was ended after {after_s:.1f} s: its process(es) {', '.join(names)} stopped "
            "themselves (SIGSTOP or SIGTSTP), and nothing in the sandbox can continue them]\n")


def _args_fd(options: Sequence[str]) -> int:
    """A memfd holding bwrap's options NUL-separated, read (and closed) by `bwrap --args`."""
    fd = os.memfd_create("rlvr-bwrap-args", 0)
    os.write(fd, b"".join(o.encode("utf-8", "surrogateescape") + b"\0" for o in options))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def chown_tree(path: Path, uid: int) -> None:
    """Give the sandbox uid ownership of a tree it must write to (no symlink following)."""
    os.lchown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


_HOST_OK: Path | None = None   # the sandbox Python the host check passed with (RLVR_HOME may move)


def check_host() -> None:
    """Raise SandboxUnavailable with the fix if this host cannot run the sandbox."""
    global _HOST_OK
    py = sandbox_python_dir() / "bin" / "python"
    if _HOST_OK == py:
        return
    missing = [b for b in ("bwrap", "setpriv", "prlimit", "mount") if shutil.which(b) is None]
    if missing:
        raise SandboxUnavailable(
            f"cannot sandbox: {', '.join(missing)} not found; install bubblewrap and util-linux "
            "(scripts/setup.sh does it)")
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "cannot sandbox: the environment host process must run as root so it can drop "
            "commands to an unprivileged uid (setpriv) and mount size-limited checkouts")
    if not py.exists():
        raise SandboxUnavailable(
            f"cannot sandbox: no sandbox Python at {py}; run scripts/setup.sh "
            "(or set RLVR_HOME to where it lives)")
    probe = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
         "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64",
         "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--", "/usr/bin/true"],
        capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SandboxUnavailable(
            "cannot sandbox: bwrap failed as an unprivileged user (are unprivileged user "
            f"namespaces enabled? sysctl kernel.unprivileged_userns_clone=1): {probe.stderr.strip()}")
    _HOST_OK = py


class QuotaDir:
    """A directory backed by its own size-limited tmpfs: a disk quota for one environment."""

    def __init__(self, path: Path, size_mib: int) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=False)
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755,nosuid,nodev",
                              "tmpfs", str(self.path)], capture_output=True, text=True)
        if res.returncode != 0:
            self.path.rmdir()
            raise SandboxUnavailable(f"cannot mount a size-limited tmpfs at {self.path}: "
                                     f"{res.stderr.strip()} (the environment host must run as root)")
        self.mounted = True

    def close(self) -> None:
        if self.mounted:
            res = subprocess.run(["umount", str(self.path)], capture_output=True, text=True)
            if res.returncode != 0:   # still busy: detach now, the kernel frees it when idle
                subprocess.run(["umount", "-l", str(self.path)], check=True)
            self.mounted = False
            self.path.rmdir()
