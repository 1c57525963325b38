"""Execution reward on real mined toolz tasks, verified in the sandbox on a pristine copy."""
from __future__ import annotations

import time

import pytest

from tests.fixtures.env import episode, replace_body, task_by_qualname, toolz_tasks
from tests.fixtures.tamper_attacks import PATCH_REPORTS


@pytest.fixture(scope="module")
def tasks():
    return toolz_tasks()


@pytest.fixture(scope="module")
def merge_task(tasks):
    return task_by_qualname(tasks, "merge")


WRONG_MERGE = """\
    rv = {}
    for d in dicts:
        rv.update(d)
    return rv
"""


def test_original_body_scores_full(merge_task):
    with episode(merge_task) as env:
        replace_body(env, merge_task.original_body)
        r = env.reward()
    assert r.reward == 1.0 and r.edited and r.error is None, r
    assert r.tests_passed == r.tests_total == len(merge_task.fail_to_pass) + len(merge_task.pass_to_pass)


def test_stub_without_edit_scores_zero(merge_task):
    with episode(merge_task) as env:
        env.call_tool("bash", {"command": "python -m pytest -q -x toolz/tests/test_dicttoolz.py; true"})
        r = env.reward()
    assert r.reward == 0.0 and not r.edited and r.parts["reason"] == "no source file was edited"


def test_wrong_implementation_gets_partial_credit(merge_task):
    with episode(merge_task) as env:
        replace_body(env, WRONG_MERGE)
        r = env.reward()
    assert 0.0 < r.reward < 1.0, r
    assert r.parts["p2p_failed"] == 0 and r.parts["f2p_passed"] < r.parts["f2p_total"]


def test_only_the_target_function_is_taken(tasks, merge_task):
    """Another module's change is not taken; a change elsewhere in the target module scores 0."""
    other = task_by_qualname(tasks, "frequencies")
    assert other.module_path != merge_task.module_path
    with episode(merge_task) as env:
        replace_body(env, merge_task.original_body)
        res = env.call_tool("edit", {"path": other.module_path,
                                     "edits": [{"oldText": other.original_body, "newText": other.stub_body}]})
        assert not res.is_error, res.content
        r = env.reward()
        assert r.reward == 1.0 and r.parts["ignored_files"] == [other.module_path], r
        res = env.call_tool("edit", {"path": merge_task.module_path,
                                     "edits": [{"oldText": "def merge(", "newText": "X = 1\n\n\ndef merge("}]})
        assert not res.is_error, res.content
        r = env.reward()
    assert r.reward == 0.0 and "changed outside the body of merge" in r.error and r.flags, r


def test_a_p2p_regression_scores_zero():
    """A mutation task's stub is a bug the PASS_TO_PASS tests still pass on: a body that breaks
    what they check scores 0 whatever it does to the FAIL_TO_PASS ones."""
    from envs.tasks import SHIPPED_TASKS, load_tasks
    task = next(t for t in load_tasks(SHIPPED_TASKS / "toolz-mutation.jsonl") if t.id.endswith("merge:mutation@33"))
    with episode(task) as env:
        replace_body(env, "    if 1 / 0:\n")   # the mutated line (a mutation task's stub) now raises
        r = env.reward()
    assert r.reward == 0.0 and r.parts["p2p_failed"] >= 1 and "previously passing" in r.error, r


def test_state_a_body_breaks_stays_in_its_own_tests_process(merge_task):
    """Each test runs in its own process: a body that breaks its module's shared state (correct
    once, then every later call wrong) fails the tests that call it again, never another test."""
    with episode(merge_task) as env:
        replace_body(env, "    global _get_factory\n" + merge_task.original_body.replace(
            "    return rv", "    _get_factory = lambda f, kw: list\n    return rv"))
        r = env.reward()
    assert 0.0 < r.reward < 1.0 and r.parts["p2p_failed"] == 0, r


def test_test_and_conftest_edits_are_ignored(merge_task):
    with episode(merge_task) as env:
        env.call_tool("write", {"path": "conftest.py", "content":
                                "import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
                                "def pytest_runtest_makereport(item, call):\n"
                                "    call.excinfo = None\n    yield\n"})
        env.call_tool("write", {"path": "toolz/tests/test_dicttoolz.py", "content": "def test_ok():\n    pass\n"})
        r = env.reward()
    assert r.reward == 0.0 and not r.edited


def test_infinite_loop_is_bounded_and_recorded(merge_task):
    with episode(merge_task, test_timeout_s=1.0, verify_timeout_s=120.0) as env:
        replace_body(env, "    while True:\n        pass\n")
        start = time.monotonic()
        r = env.reward()
    assert time.monotonic() - start < 90
    assert r.reward == 0.0 and r.parts["f2p_passed"] == 0, r


def test_verification_wall_clock_is_a_failure_not_a_hang(merge_task):
    with episode(merge_task, test_timeout_s=60.0, verify_timeout_s=3.0) as env:
        replace_body(env, "    import time\n    time.sleep(1000)\n")
        start = time.monotonic()
        r = env.reward()
    assert time.monotonic() - start < 20
    assert r.reward == 0.0 and r.parts["timed_out"] and "timed out" in r.error



SWALLOW_EXCEPTIONS = """\
import _pytest.runner as _run

_orig_from_call = _run.CallInfo.from_call.__func__


def _from_call(cls, func, when, reraise=None):
    info = _orig_from_call(cls, func, when, reraise)
    info.excinfo = None
    return info


_run.CallInfo.from_call = classmethod(_from_call)
"""


@pytest.mark.parametrize("attack", [PATCH_REPORTS, SWALLOW_EXCEPTIONS], ids=["patch-report", "swallow-exc"])
def test_pytest_tampering_does_not_earn_reward(merge_task, attack):
    """A wrong implementation that patches pytest from the module under test."""
    with episode(merge_task) as env:
        replace_body(env, "    return None\n")
        res = env.call_tool("edit", {"path": merge_task.module_path, "edits": [
            {"oldText": "def merge(", "newText": attack + "\n\ndef merge("}]})
        assert not res.is_error, res.content
        # the attack is real: pytest's own summary reports success for the wrong code
        plain = env.call_tool("bash", {"command": "python -m pytest -q -p no:cacheprovider toolz/tests/test_dicttoolz.py 2>&1 | tail -1"})
        r = env.reward()
    assert "failed" not in plain.content and "passed" in plain.content, plain.content
    assert r.reward == 0.0 and r.flags and "changed outside the body of merge" in r.error, r


def test_exiting_the_test_process_early_earns_nothing(merge_task):
    with episode(merge_task) as env:
        replace_body(env, "    import os\n    os._exit(0)\n")
        r = env.reward()
    assert r.reward == 0.0 and r.error, r


@pytest.mark.parametrize("level", ["last_lines", "branch", "return", "statement"])
def test_partial_stubs_score_like_whole_body_stubs(level):
    """At every level: the untouched stub scores 0, the removed code put back scores 1.0, and a
    rewrite of the whole function (not only the hole) is still the target function's body."""
    from envs.tasks import SHIPPED_TASKS, load_tasks
    task = next(t for t in load_tasks(SHIPPED_TASKS / "toolz-levels.jsonl") if t.level == level)
    with episode(task) as env:
        assert env.reward().reward == 0.0
        replace_body(env, task.original_body)
        r = env.reward()
        assert r.reward == 1.0 and not r.flags, (r.error, r.flags)
    with episode(task) as env:   # the hole filled with a wrong line: the F2P tests fail
        replace_body(env, task.stub_body.replace("raise NotImplementedError", "print('hole')", 1))
        r = env.reward()
        assert r.reward < 1.0 and not r.flags, (r.reward, r.error, r.flags)
