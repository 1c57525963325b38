"""Execution reward: the repository's own tests, run on a pristine copy of the repo with only
the agent's target function taken from its checkout, read through the verification plugin,
and checked against the original outside the test process by the differential gate.

Rules: no edit of the target module -> 0; a change in that module outside the target
function's body (new imports at the top aside) or introspection in the body -> 0 (see
envs/screen.py); any PASS_TO_PASS regression -> 0; tampering or a refused operation seen in
the test process -> 0; otherwise the fraction of FAIL_TO_PASS tests that pass (1.0 = full
pass), lowered to the fraction of the gate's inputs on which the candidate returns what the
original does where the task has gate inputs (envs/gate.py): 1.0 needs the tests and the gate.
A test that never reports (timeout, crash, hang) is a failure. Changes to any other file are
not taken (they are listed in parts["ignored_files"]). Every reason for a 0 that is not a
test outcome is a line in `flags`, for the trace and the training metrics.
"""
from __future__ import annotations

import filecmp
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from envs.gate import GateJob, gate_calls, link_tree, replace_module
from envs.sandbox import INSIDE_REPO, Limits, Sandbox
from envs.screen import screen
from envs.tasks import Task
from envs.testrun import run_tests

TEST_DIR_NAMES = {"tests", "test", "testing"}


@dataclass
class RewardResult:
    reward: float
    parts: dict = field(default_factory=dict)
    edited: bool = False
    tests_passed: int = 0
    tests_total: int = 0
    seconds: float = 0.0
    error: str | None = None
    flags: list[str] = field(default_factory=list)   # tampering/screen reasons: non-empty => reward 0


def is_test_path(rel: str) -> bool:
    """Test code and test configuration: never taken from the agent's checkout."""
    p = Path(rel)
    name = p.name
    return (any(part in TEST_DIR_NAMES for part in p.parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def changed_sources(task: Task, checkout: Path, pristine: Path) -> list[str]:
    """Non-test .py files the agent changed or added inside existing packages (relative paths)."""
    stubbed = task.stubbed_source((pristine / task.module_path).read_text())
    changed = []
    for root, dirs, files in os.walk(checkout):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        for name in files:
            if not name.endswith(".py"):
                continue
            host = Path(root) / name
            rel = str(host.relative_to(checkout))
            if is_test_path(rel) or host.is_symlink() or not host.is_file():
                continue
            if rel == task.module_path:
                if host.read_text(errors="replace") != stubbed:
                    changed.append(rel)
                continue
            orig = pristine / rel
            if orig.exists():
                if not filecmp.cmp(host, orig, shallow=False):
                    changed.append(rel)
            elif (orig.parent / "__init__.py").exists():   # new module inside an existing package
                changed.append(rel)
    return sorted(changed)


def build_verify_tree(task: Task, submitted: str, pristine: Path, dest: Path) -> None:
    """Pristine tree (linked, envs/gate.py link_tree) with the agent's target module in a file of
    its own; root-owned, read-only to the sandbox. The module's pristine .pyc (which holds the
    reference body) is removed."""
    link_tree(pristine, dest)
    replace_module(dest, task.module_path, submitted)
    os.chmod(dest / task.module_path, 0o644)


def compute_reward(task: Task, checkout: Path, pristine: Path, scratch: Path, uid: int,
                   limits: Limits, timeout_s: float, per_test_timeout_s: float,
                   site_overlay: Path | None = None) -> RewardResult:
    """site_overlay: the task's test-dependency overlay (envs/testdeps.py), if it has one."""
    start = time.monotonic()
    if not checkout.is_dir():
        return RewardResult(0.0, {"reason": "checkout missing"}, error=f"the checkout {checkout} is gone; "
                            "the environment broke during the episode", seconds=time.monotonic() - start)
    files = changed_sources(task, checkout, pristine)
    total = len(task.fail_to_pass) + len(task.pass_to_pass)
    ignored = [f for f in files if f != task.module_path]
    if task.module_path not in files:
        return RewardResult(0.0, {"reason": "no source file was edited", "ignored_files": ignored[:20]},
                            edited=False, tests_total=total, seconds=time.monotonic() - start)
    original = (pristine / task.module_path).read_text()
    submitted = (checkout / task.module_path).read_bytes().decode("utf-8", errors="replace")
    checked = screen(task, submitted, task.stubbed_source(original), original)
    if checked.flags:
        return RewardResult(0.0, {"reason": "submission refused", "ignored_files": ignored[:20]}, edited=True,
                            tests_total=total, seconds=time.monotonic() - start,
                            error=checked.flags[0], flags=checked.flags)
    dest = scratch / f"verify-{uuid.uuid4().hex[:8]}"
    target = (f"{INSIDE_REPO}/{task.module_path}", *checked.def_range)
    verdict = gate = None
    try:
        build_verify_tree(task, submitted, pristine, dest)
        if gate_calls(task):   # both sides next to the test run, each in a sandbox of its own
            gate = GateJob(task, dest, pristine, scratch, uid, limits, timeout_s, site_overlay)
        sandbox = Sandbox(dest, uid=uid, limits=limits, workdir_readonly=True, site_overlay=site_overlay)
        run = run_tests(sandbox, task.test_command, timeout_s=timeout_s,
                        per_test_timeout_s=per_test_timeout_s, target=target, allow=checked.allowed,
                        qualname=task.qualname)
        if gate is not None:
            verdict = gate.wait()
    finally:
        if gate is not None and verdict is None:   # the test run failed: its gate ends before the trees go
            gate.wait()
        shutil.rmtree(dest, ignore_errors=True)
    f2p_passed = [t for t in task.fail_to_pass if run.outcomes.get(t) == "passed"]
    p2p_failed = [t for t in task.pass_to_pass if run.outcomes.get(t) != "passed"]
    parts = {"f2p_passed": len(f2p_passed), "f2p_total": len(task.fail_to_pass),
             "p2p_failed": len(p2p_failed), "p2p_total": len(task.pass_to_pass),
             "p2p_failed_ids": p2p_failed[:10], "changed_files": [task.module_path],
             "ignored_files": ignored[:20], "tampered": run.tampered[:5], "timed_out": run.timed_out,
             "collect_errors": run.collect_errors[:5], "pytest_seconds": run.seconds,
             "gate": verdict.summary() if verdict is not None else
             {"inputs": 0, "note": task.gate.get("note", "no gate inputs recorded for this task")}}
    error = None
    flags = [f"tampering with the test run detected: {t}" for t in run.tampered[:5]]
    flags += [f"refused in the test process: {r}" for r in run.refused[:5]]
    if flags:   # a refusal is a verdict even when the session then crashed or hung
        reward, error = 0.0, flags[0]
    elif not run.finished:
        reward = 0.0
        error = ("verification timed out after %gs" % timeout_s if run.timed_out else
                 "the test session did not finish (crash or exit from the code under test)")
    elif p2p_failed:
        reward = 0.0
        error = f"{len(p2p_failed)} previously passing test(s) now fail, e.g. {p2p_failed[0]}"
    else:
        reward = len(f2p_passed) / len(task.fail_to_pass)
        if verdict is not None and verdict.fraction < reward:
            reward, error = verdict.fraction, verdict.why()
    passed = len(f2p_passed) + len(task.pass_to_pass) - len(p2p_failed)
    return RewardResult(reward, parts, edited=True, tests_passed=passed,
                        tests_total=len(task.fail_to_pass) + len(task.pass_to_pass),
                        seconds=time.monotonic() - start, error=error, flags=flags)
