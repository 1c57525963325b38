"""Hostile commands against the real sandbox (bubblewrap as an unprivileged uid): each must be
contained, bounded in time, and leave nothing running."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs import sandbox as sbx
from envs.sandbox import Limits, QuotaDir, Sandbox, chown_tree, processes_of_uid
from envs.testrun import BASE_PYTEST, run_tests

UID = 63900
WORK = Path("/tmp/agentic-rlvr-test")


@pytest.fixture
def box():
    WORK.mkdir(parents=True, exist_ok=True)
    os.chmod(WORK, 0o755)
    quota = QuotaDir(WORK / f"sbx-{os.getpid()}-{time.monotonic_ns()}", 48)
    repo, tmp = quota.path / "repo", quota.path / "tmp"
    repo.mkdir()
    tmp.mkdir()
    chown_tree(quota.path, UID)
    limits = Limits(cpu_s=20, memory_mib=512, max_processes=32, max_file_mib=8)
    sandbox = Sandbox(repo, uid=UID, limits=limits, tmp_dir=tmp, max_output_chars=5000)
    yield sandbox
    leftovers = processes_of_uid(UID)
    sbx.kill_uid(UID)
    quota.close()
    assert leftovers == [], f"processes left running after the test: {leftovers}"


def test_runs_confined_as_unprivileged_user(box):
    res = box.run("id -u; pwd; ls /", 10)
    lines = res.output.split()
    assert res.exit_code == 0 and lines[0] == str(UID) and lines[1] == "/repo"
    assert "root" not in lines and "home" not in lines and "work" not in lines


def test_processes_inside_show_no_host_path(box):
    """ps, and every process's command line and environment: bwrap (the sandbox's pid 1) got
    its bind mounts through a file descriptor and a bare environment, so neither the checkout's
    host path, the project's, its venv's nor /root shows."""
    res = box.run("ps auxww; for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do "
                  "echo \"$f: $(tr '\\0' ' ' < $f)\"; done", 10)
    assert res.exit_code == 0 and "/proc/1/cmdline: bwrap" in res.output and "ps auxww" in res.output, res.output
    project = Path(__file__).resolve().parents[2]
    for host in (str(box.workdir), str(box.tmp_dir), str(project), sys.prefix, "/root", "/work"):
        assert host not in res.output, f"{host} shows inside the sandbox:\n{res.output}"


def test_no_network(box):
    host_ip = socket.gethostbyname(socket.gethostname())
    script = ("import socket\n"
              f"for addr in [('1.1.1.1', 80), ('{host_ip}', 22), ('pypi.org', 443)]:\n"
              "    try:\n"
              "        socket.create_connection(addr, timeout=2); print('CONNECTED', addr)\n"
              "    except OSError as e: print('blocked', addr, type(e).__name__)\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
              "socket.create_connection(s.getsockname(), timeout=2); print('loopback ok')\n")
    res = box.run(f"python -c \"{script}\"", 20)
    assert "CONNECTED" not in res.output, res.output
    assert res.output.count("blocked") == 3 and "loopback ok" in res.output, res.output


def test_cannot_write_outside_checkout(box):
    marker = f"escape-{os.getpid()}"
    res = box.run(f"for d in / /usr /opt/agentic-rlvr/sandbox-venv /etc /proc/sys/kernel; do "
                  f"echo x > $d/{marker} && echo WROTE $d; done; echo x > /tmp/{marker}; echo done", 10)
    assert "WROTE" not in res.output and "done" in res.output, res.output
    for d in ["/", "/usr", "/etc", str(sbx.sandbox_python_dir())]:
        assert not os.path.exists(os.path.join(d, marker))
    assert not os.path.exists(f"/tmp/{marker}")          # the sandbox's /tmp is its own
    assert (box.tmp_dir / marker).exists()


def test_cannot_read_root_only_files(box):
    secret = box.workdir / "secret.txt"
    secret.write_text("TOP-SECRET")
    os.chown(secret, 0, 0)
    os.chmod(secret, 0o600)
    res = box.run("cat secret.txt; cat /etc/shadow; ls /root; echo end", 10)
    assert "TOP-SECRET" not in res.output and "end" in res.output
    assert "Permission denied" in res.output and "/etc/shadow: No such file" in res.output


def test_cannot_signal_outside_processes(box):
    same_uid = subprocess.Popen(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                                 "sleep", "60"])
    as_root = subprocess.Popen(["sleep", "60"])
    try:
        res = box.run(f"kill -9 {same_uid.pid} {as_root.pid}; kill -9 -1; echo sent", 10)
        for p in (same_uid, as_root):  # a delivered SIGKILL ends them within this wait
            with pytest.raises(subprocess.TimeoutExpired):
                p.wait(timeout=1)
        assert "sent" in res.output, res.output
    finally:
        for p in (same_uid, as_root):
            p.kill()
            p.wait()


def test_fork_bomb_is_contained(box):
    """A bomb whose top shell stays alive (a plain `:(){ :|:& };:` shell exits at once, and
    its children then die with the sandbox before any meets the limit: that proves nothing).
    Containment: the process limit is met, the call returns within its bound, the uid is left
    with no process, and the next command in the same sandbox works."""
    start = time.monotonic()
    res = box.run("bomb() { bomb | bomb & }; bomb; sleep 60", 5)
    assert time.monotonic() - start < 15
    assert res.timed_out, res.output[-500:]
    assert "Resource temporarily unavailable" in res.output, res.output[-500:]   # RLIMIT_NPROC met
    assert processes_of_uid(UID) == []
    assert box.run("echo alive", 10).output.strip() == "alive"


def test_filling_the_disk_is_bounded(box):
    free_before = shutil.disk_usage("/").free
    res = box.run("head -c 100M /dev/zero > big; echo big=$?; "
                  "for i in $(seq 20); do head -c 7M /dev/zero > f$i || break; done; du -sm . | cut -f1", 30)
    assert "big=153" in res.output or "File size limit" in res.output, res.output  # SIGXFSZ: RLIMIT_FSIZE
    assert "No space left" in res.output, res.output
    used_mib = int(res.output.strip().split()[-1])
    assert used_mib <= 48
    assert shutil.disk_usage("/").free > free_before - 100 * 1024 * 1024


def test_gigabytes_of_output_are_bounded(box):
    start = time.monotonic()
    res = box.run("yes 'spam spam spam spam'", 60)
    assert time.monotonic() - start < 30
    assert res.output_limit_hit and res.truncated and len(res.output) <= 5000
    assert res.total_output_bytes >= box.limits.max_output_bytes


def test_wall_clock_kills_everything(box):
    start = time.monotonic()
    res = box.run("sleep 100 & setsid sleep 100 & nohup sleep 100 >/dev/null 2>&1 & sleep 100", 1)
    assert res.timed_out and res.exit_code == 124
    assert time.monotonic() - start < 5
    assert processes_of_uid(UID) == []


def test_a_command_that_stops_itself_is_ended_promptly(box):
    """SIGSTOP (a body that stops its own process): nothing in the sandbox can continue it, so
    the run ends within seconds instead of at its time limit."""
    start = time.monotonic()
    res = box.run("echo before; python3 -c 'import os, signal; os.kill(os.getpid(), signal.SIGSTOP)'", 60)
    assert res.stopped and not res.timed_out and res.exit_code == -19 and "before" in res.output
    assert "python3 stopped themselves (SIGSTOP or SIGTSTP)" in res.output.splitlines()[-1], res.output
    assert time.monotonic() - start < 10
    assert processes_of_uid(UID) == []


def test_a_test_run_whose_code_stops_itself_ends_promptly(box):
    """A test that SIGSTOPs its own process -- a runner the reporter forked -- fails at once and
    the verification ends in seconds, not at its 120 s limit (a stopped sandbox process itself
    is the test above)."""
    (box.workdir / "test_stop.py").write_text("import os, signal\n\n\ndef test_stops():\n"
                                              "    os.kill(os.getpid(), signal.SIGSTOP)\n")
    chown_tree(box.workdir, UID)
    start = time.monotonic()
    run = run_tests(box, BASE_PYTEST, timeout_s=120.0)
    assert time.monotonic() - start < 10
    assert run.finished and not run.timed_out and run.outcomes == {"test_stop.py::test_stops": "failed"}, run


def test_background_processes_die_with_the_command(box):
    res = box.run("setsid sleep 100 & (sleep 100 &); echo started", 10)
    assert res.exit_code == 0 and "started" in res.output and not res.timed_out
    assert processes_of_uid(UID) == []


def test_memory_limit(box):
    res = box.run("python -c \"x = bytearray(2 * 1024**3); print('ALLOCATED')\"", 20)
    assert "ALLOCATED" not in res.output and "MemoryError" in res.output


def test_popen_long_running_process_with_node(box):
    node = os.path.realpath(shutil.which("node"))
    proc = box.popen([node, "-e", "console.log('node', process.version); setTimeout(() => {}, 60000)"],
                     memory_mib=0, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    line = proc.stdout.readline().decode()
    assert line.startswith("node v"), line
    assert processes_of_uid(UID)
    Sandbox.kill(proc)
    assert processes_of_uid(UID) == []


def test_clear_error_when_host_cannot_sandbox(monkeypatch):
    monkeypatch.setattr(sbx, "_HOST_OK", None)
    real_which = shutil.which
    monkeypatch.setattr(sbx.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    with pytest.raises(sbx.SandboxUnavailable, match="bwrap not found; install bubblewrap"):
        Sandbox(Path("/tmp"), uid=UID)


def test_a_niced_sandbox_runs_everything_at_that_priority_and_cannot_raise_it(box):
    """env.nice: the agent's commands and the tests yield the cores to an engine on the host."""
    box.limits = Limits(cpu_s=20, memory_mib=512, max_processes=32, max_file_mib=8, nice=7)
    res = box.run("nice; bash -c nice; nice -n -5 nice", 10)   # GNU nice warns, then runs it unchanged
    lines = res.output.splitlines()
    assert [lines[0], lines[1], lines[-1]] == ["7", "7", "7"] and "Permission denied" in res.output, res.output
    assert Sandbox(box.workdir, uid=UID, limits=Limits()).argv()[0][0] == "setpriv"   # 0: no nice at all
