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
import ctypes
import platform
import select
import shutil
import signal
import struct
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

INSIDE_REPO = "/repo"           # where the checkout appears inside the sandbox
INSIDE_TMP = "/tmp"
_MIB = 1024 * 1024
_ARGV_COMMAND_MAX = 100_000     # bytes of a command passed as bash -c's argument

# Read-only system paths every sandbox sees. /etc is not bound whole: only what programs
# need to start; /etc/shadow and friends simply do not exist inside.
_RO_SYSTEM = ["/usr"]
_ETC_FILES = ["/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/ld.so.cache",
              "/etc/localtime", "/etc/alternatives", "/etc/mime.types"]


class SandboxUnavailable(RuntimeError):
    """The host cannot sandbox (missing bwrap/setpriv, not root, no user namespaces)."""


def rlvr_home() -> Path:
    return Path(os.environ.get("RLVR_HOME", "/opt/agentic-rlvr"))


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


@dataclass
class CommandResult:
    exit_code: int                  # -N: killed by signal N; 124 when the wall clock ran out
    output: str                     # stdout+stderr merged; the tail when truncated
    timed_out: bool
    truncated: bool
    seconds: float
    total_output_bytes: int = 0
    output_limit_hit: bool = False


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

    def __post_init__(self) -> None:
        check_host()
        self.workdir = Path(self.workdir)

    # --- building the command line -------------------------------------------------------
    def argv(self, inner: Sequence[str], env: Mapping[str, str] | None = None,
             extra_ro_binds: Sequence[tuple[str, str]] = (),
             extra_rw_binds: Sequence[tuple[str, str]] = (),
             share_net: bool = False, memory_mib: int | None = None,
             cpu_s: int | None = None, seccomp_fd: int | None = None) -> list[str]:
        lim = self.limits
        mem = lim.memory_mib if memory_mib is None else memory_mib
        cpu = lim.cpu_s if cpu_s is None else cpu_s
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
               "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
               "prlimit", f"--cpu={cpu}:{cpu + 1}", f"--nproc={lim.max_processes}",
               f"--fsize={lim.max_file_mib * _MIB}", "--core=0", "--nofile=1024"]
        if mem > 0:
            cmd.append(f"--as={mem * _MIB}")
        cmd += ["--", "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
                "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
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
        for k, v in full_env.items():
            cmd += ["--setenv", k, v]
        return cmd + ["--", *inner]

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
        filt = _seccomp_fd()
        try:
            proc = _spawn(
                self.argv(inner, env=env, extra_ro_binds=extra_ro_binds, seccomp_fd=filt,
                          cpu_s=max(1, int(timeout_s) + 1) if timeout_s < self.limits.cpu_s else None),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, pass_fds=tuple(pass_fds) + ((filt,) if filt is not None else ()))
        finally:
            if filt is not None:
                os.close(filt)
        proc.sandbox_uid = self.uid
        tail = bytearray()
        total = 0
        timed_out = limit_hit = False
        deadline = start + timeout_s
        fd = proc.stdout.fileno()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
                if not ready:
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
        exit_code = 124 if timed_out else proc.returncode
        text = tail.decode("utf-8", errors="replace")
        truncated = total > len(tail) or len(text) > cap
        if len(text) > cap:
            text = text[-cap:]
        return CommandResult(exit_code=exit_code, output=text, timed_out=timed_out,
                             truncated=truncated, seconds=time.monotonic() - start,
                             total_output_bytes=total, output_limit_hit=limit_hit)

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
        filt = _seccomp_fd()
        fds = tuple(popen_kwargs.pop("pass_fds", ())) + ((filt,) if filt is not None else ())
        try:
            proc = _spawn(
                self.argv(inner, env=env, extra_ro_binds=extra_ro_binds, extra_rw_binds=extra_rw_binds,
                          share_net=share_net, memory_mib=memory_mib, cpu_s=cpu_s, seccomp_fd=filt),
                start_new_session=True, pass_fds=fds, **popen_kwargs)
        finally:
            if filt is not None:
                os.close(filt)
        proc.sandbox_uid = self.uid  # lets Sandbox.kill wait until the sandbox is really empty
        return proc

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


def _uid_processes(uid: int) -> list[tuple[int, str, int]]:
    """(pid, state, ppid) of every process, zombies included, whose real uid is `uid`."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        state = ppid = None
        try:
            with open(f"/proc/{entry.name}/status") as f:
                for line in f:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("PPid:"):
                        ppid = int(line.split()[1])
                    elif line.startswith("Uid:"):
                        if int(line.split()[1]) == uid and state != "X":
                            out.append((int(entry.name), state, ppid))
                        break
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def processes_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is `uid`, zombies included: they hold RLIMIT_NPROC slots."""
    return [pid for pid, _, _ in _uid_processes(uid)]


def _in_child_pid_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except (FileNotFoundError, ProcessLookupError):
        return False


def kill_sandboxed(uid: int, timeout_s: float = 10.0) -> int:
    """Like kill_uid, but only processes inside a sandbox's pid namespace (never a host
    process that happens to share the uid)."""
    return kill_uid(uid, timeout_s, only=_in_child_pid_namespace)


def kill_uid(uid: int, timeout_s: float = 10.0, only=lambda pid: True) -> int:
    """SIGKILL every process of `uid`, reap the zombies orphaned to this process, and wait
    until none of either is left; count the processes killed.

    A killed process lingers until the kernel delivers the signal, and a fork in flight can
    add one: loop. Zombies whose parent is some other live host process are its to reap."""
    if uid == 0:
        raise ValueError("refusing to kill processes of uid 0")
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        procs = _uid_processes(uid)
        live = [p for p, state, _ in procs if state != "Z" and only(p)]
        mine = {p for p, _, _ in procs}
        pending = [p for p, state, ppid in procs if state == "Z" and (ppid == os.getpid() or ppid in mine)
                   and not _owned(p)]   # a Popen not yet waited for is its owner's to reap
        if not live and not pending:
            return len(killed)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {live + pending} of sandbox uid {uid} survived SIGKILL for {timeout_s} s")
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed.update(live)
        reap_orphans(uid)
        time.sleep(0.002 if not live else 0.01)


# --- reaping: this process is a child subreaper -------------------------------------------
# bwrap's outer process exits as soon as its pid 1 reports the command's status, without
# waiting for it, so every command orphans that pid 1. As a subreaper this process inherits
# it and reaps it here; only zombies of a sandbox uid, never a child a Popen still owns.
_REAP_LOCK = threading.Lock()
_OWNED: "weakref.WeakValueDictionary[int, subprocess.Popen]" = weakref.WeakValueDictionary()
_SUBREAPER = False


def _become_subreaper() -> None:
    global _SUBREAPER
    if _SUBREAPER:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:   # PR_SET_CHILD_SUBREAPER
        err = ctypes.get_errno()
        raise SandboxUnavailable(f"cannot become a child subreaper: {os.strerror(err)}")
    _SUBREAPER = True


def _spawn(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    _become_subreaper()
    with _REAP_LOCK:
        proc = subprocess.Popen(argv, **popen_kwargs)
        _OWNED[proc.pid] = proc
    return proc


def _owned(pid: int) -> bool:
    owner = _OWNED.get(pid)
    return owner is not None and owner.returncode is None


def reap_orphans(uid: int) -> int:
    """Reap zombies of `uid` reparented to this process; count them."""
    n = 0
    with _REAP_LOCK:
        for pid, state, ppid in _uid_processes(uid):
            if state != "Z" or ppid != os.getpid() or _owned(pid):
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                n += 1
            except ChildProcessError:
                pass
    return n


# --- seccomp: what no sandboxed process may do -----------------------------------------------
# (audit arch, [ptrace, process_vm_readv, process_vm_writev]); ptrace could stop the sandbox's
# pid 1 (the command then hangs to the wall clock) or steer another process of the sandbox.
_DENY = {"x86_64": (0xC000003E, [101, 310, 311]), "aarch64": (0xC00000B7, [117, 270, 271])}


def seccomp_program() -> bytes | None:
    """Classic BPF for `bwrap --seccomp`: the denied calls and every foreign ABI (i386, x32,
    which could name them by other numbers) fail with EPERM. None on an unknown machine."""
    if platform.machine() not in _DENY:
        return None
    arch, nrs = _DENY[platform.machine()]
    checks = [(0x35, 0x40000000)] if platform.machine() == "x86_64" else []   # jge: x32 ABI
    checks += [(0x15, nr) for nr in nrs]                                      # jeq
    deny = 3 + len(checks) + 1                  # index of the final "return EPERM"
    prog = [(0x20, 0, 0, 4),                    # A = seccomp_data.arch
            (0x15, 0, deny - 2, arch),          # foreign arch -> deny
            (0x20, 0, 0, 0)]                    # A = seccomp_data.nr
    for i, (op, k) in enumerate(checks):
        prog.append((op, deny - (3 + i) - 1, 0, k))
    prog += [(0x06, 0, 0, 0x7FFF0000),          # allow
             (0x06, 0, 0, 0x00050000 | 1)]      # errno EPERM
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def _seccomp_fd() -> int | None:
    prog = seccomp_program()
    if prog is None:
        return None
    fd = os.memfd_create("rlvr-seccomp", 0)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def chown_tree(path: Path, uid: int) -> None:
    """Give the sandbox uid ownership of a tree it must write to (no symlink following)."""
    os.lchown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


_HOST_OK: bool | None = None


def check_host() -> None:
    """Raise SandboxUnavailable with the fix if this host cannot run the sandbox."""
    global _HOST_OK
    if _HOST_OK:
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
    py = sandbox_python_dir() / "bin" / "python"
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
    _HOST_OK = True


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
