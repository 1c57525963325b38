"""No process leaks: every sandboxed command's bwrap is reaped, zombies count against the uid,
and ptrace inside the sandbox is refused (it could stop the sandbox's pid 1)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from envs.sandbox import processes_of_uid, seccomp_program
from tests.fixtures.env import episode, replace_body, task_by_qualname, toolz_tasks

UID = 63017   # this file's own uid: nothing else runs as it

PTRACE_PID1 = ("python -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
               "r = libc.ptrace(16, 1, 0, 0); print('ptrace', r, os.strerror(ctypes.get_errno()))\"")


@pytest.fixture(scope="module")
def merge_task():
    return task_by_qualname(toolz_tasks(), "merge")


@pytest.mark.parametrize("calls", [100, pytest.param(500, marks=pytest.mark.heavy)])
def test_many_quick_commands_leave_nothing_behind(merge_task, calls):
    """More tool calls in one episode than the uid may have processes (64), then the reference
    body still scores 1.0 and the uid owns no process, zombie or live."""
    with episode(merge_task, sandbox_uid_base=UID) as env:
        start = time.monotonic()
        for i in range(calls):
            res = env.call_tool("bash", {"command": f"echo {i}"})
            assert not res.is_error and res.content.strip() == str(i), (i, res.content)
            if i % 100 == 0:
                assert processes_of_uid(UID) == [], i
        wall = time.monotonic() - start
        replace_body(env, merge_task.original_body)
        r = env.reward()
        left = processes_of_uid(UID)
    print(f"{calls} calls: {wall:.1f} s; processes of uid {UID} after the episode: {len(left)}")
    assert r.reward == 1.0 and r.error is None, r
    assert left == [] and processes_of_uid(UID) == []


def test_ptrace_of_the_sandbox_init_is_refused(merge_task):
    assert seccomp_program() is not None, "no seccomp filter for this machine"
    with episode(merge_task, sandbox_uid_base=UID) as env:
        start = time.monotonic()
        res = env.call_tool("bash", {"command": PTRACE_PID1 + "; echo next"})
        wall = time.monotonic() - start
        assert processes_of_uid(UID) == []
        after = env.call_tool("bash", {"command": "echo alive"})
    print(f"ptrace command: {wall:.3f} s")
    assert "ptrace -1 Operation not permitted" in res.content and "next" in res.content, res.content
    assert not res.is_error and wall < 5, (wall, res.content)
    assert after.content.strip() == "alive"


def test_an_unwaited_popen_is_left_to_its_owner(tmp_path):
    """kill_uid must not wait on (or steal) the exit status of a sandbox Popen nobody waited for."""
    import os

    from envs.sandbox import Limits, Sandbox, kill_uid
    from tests.fixtures.env import WORK_ROOT
    work = Path(WORK_ROOT) / f"unwaited-{tmp_path.name}"
    work.mkdir(parents=True)
    os.chown(work, UID, UID)
    box = Sandbox(work, uid=UID, limits=Limits())
    proc = box.popen(["bash", "-c", "exit 7"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/stat").read_text().split()[2] != "Z":   # exited, not yet waited for
        assert time.monotonic() < deadline
        time.sleep(0.01)
    start = time.monotonic()
    kill_uid(UID)
    assert time.monotonic() - start < 2
    assert proc.wait() == 7
    Sandbox.kill(proc)
    assert processes_of_uid(UID) == []
    work.rmdir()
