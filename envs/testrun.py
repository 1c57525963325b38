"""Run a repository's tests inside the sandbox and collect per-test outcomes through the
verification plugin's pipe (never from pytest's own, forgeable, output). Only the plugin's
reporter process holds the pipe and it never runs a test (envs/verify_plugin/rlvr_verify.py
says why that makes the pipe's lines the reporter's); the lines are still parsed as untrusted."""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envs.sandbox import Sandbox

PLUGIN_DIR = Path(__file__).resolve().parent / "verify_plugin"   # the real folder: the sandbox binds it
INSIDE_PLUGIN = "/rlvr/plugin"

MAX_CHANNEL_BYTES = 32 * 1024 * 1024
BASE_PYTEST = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rlvr_verify"]


@dataclass
class TestRun:
    outcomes: dict[str, str] = field(default_factory=dict)   # nodeid -> passed|failed|skipped|xpassed
    collect_errors: list[str] = field(default_factory=list)
    collect_messages: list[str] = field(default_factory=list)   # their tracebacks' tails
    tampered: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)   # operations the audit hook refused the target
    finished: bool = False        # the plugin reached session end
    forged_lines: int = 0         # lines on the channel that are not the reporter's records
    timed_out: bool = False
    exit_code: int = 0
    output: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> set[str]:
        return {k for k, v in self.outcomes.items() if v == "passed"}


def run_tests(sandbox: Sandbox, test_command: Sequence[str], nodeids: Sequence[str] = (),
              timeout_s: float = 120.0, per_test_timeout_s: float = 10.0,
              extra_args: Sequence[str] = (), target: tuple[str, int, int] | None = None,
              allow: Sequence[str] = (), qualname: str = "") -> TestRun:
    """Run `test_command` (+ nodeids) in the sandbox's checkout with the plugin loaded.
    target: (file inside the sandbox, first line, last line) of the function under test,
    whose frames the plugin's audit hook holds to account; allow: the hook's refusals its
    reference does itself (envs/screen.py `audit_allowances`); qualname: the tested name, which
    must resolve to the target's code after collection. Each test runs in its own process with
    a deadline of twice the per-test timeout plus 5 s (past it, or stopped, it fails)."""
    read_fd, write_fd = os.pipe()
    chunks: list[bytes] = []
    flooded = []

    def drain() -> None:   # keeps reading to EOF, but stores a bounded amount (the channel is untrusted)
        size = 0
        while True:
            data = os.read(read_fd, 1 << 16)
            if not data:
                break
            size += len(data)
            if size <= MAX_CHANNEL_BYTES:
                chunks.append(data)
            elif not flooded:
                flooded.append(size)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    argv = [*test_command, f"--timeout={per_test_timeout_s:g}", *extra_args, *nodeids]
    env = {"PYTHONPATH": INSIDE_PLUGIN, "RLVR_RESULT_FD": str(write_fd), "PYTHONDONTWRITEBYTECODE": "1",
           "RLVR_TEST_DEADLINE": f"{2 * per_test_timeout_s + 5:g}"}
    if target is not None:
        env["RLVR_TARGET"] = f"{target[0]}:{target[1]}:{target[2]}:{qualname}"
        env["RLVR_ALLOW"] = ",".join(allow)
    try:
        res = sandbox.run_argv(argv, timeout_s, env=env, pass_fds=(write_fd,),
                               extra_ro_binds=[(str(PLUGIN_DIR), INSIDE_PLUGIN)])
    finally:
        os.close(write_fd)
    reader.join(timeout=10)
    os.close(read_fd)
    run = TestRun(timed_out=res.timed_out, exit_code=res.exit_code, output=res.output,
                  seconds=res.seconds)
    for line in b"".join(chunks).decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            run.forged_lines += 1
            continue
        if not isinstance(rec, dict):
            run.forged_lines += 1
            continue
        if "nodeid" in rec:
            prev = run.outcomes.get(rec["nodeid"])
            # a test reported twice keeps its worst outcome (reruns cannot launder a failure)
            if prev is None or prev == "passed":
                run.outcomes[rec["nodeid"]] = rec["outcome"]
        elif "collect_error" in rec:
            run.collect_errors.append(rec["collect_error"])
            run.collect_messages.append(str(rec.get("message", ""))[-2000:])
        elif rec.get("finished"):
            run.finished = True
            run.tampered.extend(rec.get("tampered", []))
            run.refused.extend(rec.get("refused", []))
    if flooded:
        run.tampered.append(f"result channel flooded past {MAX_CHANNEL_BYTES} bytes")
    if run.forged_lines:
        run.tampered.append(f"{run.forged_lines} lines on the result channel that are not the reporter's")
    return run
