"""Execution reward: the repository's own tests, run on a pristine copy of the repo with only
the agent's non-test source changes applied, read through the verification plugin.

Rules: no edit -> 0; any PASS_TO_PASS regression -> 0; tampering detected -> 0; otherwise
the fraction of FAIL_TO_PASS tests that pass (1.0 = full pass). A test that never reports
(timeout, crash, hang) is a failure.
"""
from __future__ import annotations

import filecmp
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from envs.sandbox import Limits, Sandbox
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


def build_verify_tree(task: Task, checkout: Path, pristine: Path, dest: Path, files: list[str]) -> None:
    """Pristine tree + stub + the agent's changed files; root-owned, read-only to the sandbox."""
    shutil.copytree(pristine, dest, symlinks=True)
    module = dest / task.module_path
    module.write_text(task.stubbed_source((pristine / task.module_path).read_text()))
    for rel in files:
        target = dest / rel
        shutil.copyfile(checkout / rel, target, follow_symlinks=False)
        os.chmod(target, 0o644)
        stale = target.parent / "__pycache__"
        if stale.is_dir():   # make sure the agent's source, not a pristine .pyc, is what runs
            for pyc in stale.glob(f"{target.stem}.*.pyc"):
                pyc.unlink()
    os.chmod(module, 0o644)


def compute_reward(task: Task, checkout: Path, pristine: Path, scratch: Path, uid: int,
                   limits: Limits, timeout_s: float, per_test_timeout_s: float) -> RewardResult:
    start = time.monotonic()
    if not checkout.is_dir():
        return RewardResult(0.0, {"reason": "checkout missing"}, error=f"the checkout {checkout} is gone; "
                            "the environment broke during the episode", seconds=time.monotonic() - start)
    files = changed_sources(task, checkout, pristine)
    if not files:
        return RewardResult(0.0, {"reason": "no source file was edited"}, edited=False,
                            tests_total=len(task.fail_to_pass) + len(task.pass_to_pass),
                            seconds=time.monotonic() - start)
    dest = scratch / f"verify-{uuid.uuid4().hex[:8]}"
    try:
        build_verify_tree(task, checkout, pristine, dest, files)
        sandbox = Sandbox(dest, uid=uid, limits=limits, workdir_readonly=True)
        run = run_tests(sandbox, task.test_command, timeout_s=timeout_s,
                        per_test_timeout_s=per_test_timeout_s)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    f2p_passed = [t for t in task.fail_to_pass if run.outcomes.get(t) == "passed"]
    p2p_failed = [t for t in task.pass_to_pass if run.outcomes.get(t) != "passed"]
    parts = {"f2p_passed": len(f2p_passed), "f2p_total": len(task.fail_to_pass),
             "p2p_failed": len(p2p_failed), "p2p_total": len(task.pass_to_pass),
             "p2p_failed_ids": p2p_failed[:10], "changed_files": files,
             "tampered": run.tampered[:5], "timed_out": run.timed_out,
             "collect_errors": run.collect_errors[:5], "pytest_seconds": run.seconds}
    error = None
    if not run.finished:
        reward = 0.0
        error = ("verification timed out after %gs" % timeout_s if run.timed_out else
                 "the test session did not finish (crash or exit from the code under test)")
    elif run.tampered:
        reward, error = 0.0, f"tampering with the test run detected: {run.tampered[0]}"
    elif p2p_failed:
        reward = 0.0
        error = f"{len(p2p_failed)} previously passing test(s) now fail, e.g. {p2p_failed[0]}"
    else:
        reward = len(f2p_passed) / len(task.fail_to_pass)
    passed = len(f2p_passed) + len(task.pass_to_pass) - len(p2p_failed)
    return RewardResult(reward, parts, edited=True, tests_passed=passed,
                        tests_total=len(task.fail_to_pass) + len(task.pass_to_pass),
                        seconds=time.monotonic() - start, error=error)
