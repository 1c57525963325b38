"""Processes of a sandbox uid: finding them (zombies included), killing them, reaping the
ones orphaned to this process (a child subreaper), and the seccomp filter every sandbox gets."""
from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct
import subprocess
import threading
import time
import weakref


class SubreaperUnavailable(RuntimeError):
    """prctl(PR_SET_CHILD_SUBREAPER) failed."""


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


def stopped_processes(uid: int) -> list[int]:
    """Processes of `uid` stopped by a signal (SIGSTOP, SIGTSTP, ...): nothing inside the
    sandbox can continue them, so a run waiting on one would wait for its whole time limit."""
    return [pid for pid, state, _ in _uid_processes(uid) if state == "T"]


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
_OWNED: weakref.WeakValueDictionary[int, subprocess.Popen] = weakref.WeakValueDictionary()
_SUBREAPER = False


def _become_subreaper() -> None:
    global _SUBREAPER
    if _SUBREAPER:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:   # PR_SET_CHILD_SUBREAPER
        err = ctypes.get_errno()
        raise SubreaperUnavailable(f"cannot become a child subreaper: {os.strerror(err)}")
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
