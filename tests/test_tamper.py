"""Tamper suite: every attack class, written through the agent's tools, scores < 1.0 and is
flagged with a reason; the reference body scores 1.0 in the same kind of episode."""
from __future__ import annotations

import pytest

from envs.reward import build_verify_tree
from envs.sandbox import INSIDE_REPO, Limits, Sandbox
from envs.screen import screen
from envs.testrun import run_tests
from tests.envs_fixtures import (
    WORK_ROOT,
    episode,
    replace_body,
    task_by_qualname,
    toolz_tasks,
)
from tests.tamper_attacks import ATTACKS, FRAME_SOURCE, HOOK_WRAPPER, WRONG, _indent

UID = 63019


@pytest.fixture(scope="module")
def merge_task():
    return task_by_qualname(toolz_tasks(), "merge")


def test_reference_body_still_scores_full(merge_task):
    with episode(merge_task, sandbox_uid_base=UID) as env:
        replace_body(env, merge_task.original_body)
        r = env.reward()
    assert r.reward == 1.0 and r.flags == [] and r.error is None, r


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_does_not_earn_reward(merge_task, attack):
    with episode(merge_task, sandbox_uid_base=UID) as env:
        ATTACKS[attack](env, merge_task)
        r = env.reward()
    assert r.reward < 1.0, (attack, r)
    print(f"\n{attack}: reward {r.reward:.2f}; {r.error or r.parts.get('reason') or ''}; "
          f"ignored {r.parts.get('ignored_files')}")


@pytest.mark.parametrize("body", [_indent(HOOK_WRAPPER) + WRONG, FRAME_SOURCE], ids=["gc-hook", "frame"])
def test_audit_hook_refuses_what_the_screen_would_miss(merge_task, body, tmp_path):
    """Defence in depth: the same attacks, the static screen bypassed, are refused at run time."""
    from pathlib import Path

    from envs.coding_env import pristine_for
    pristine = pristine_for(merge_task)
    original = (pristine / merge_task.module_path).read_text()
    stubbed = merge_task.stubbed_source(original)
    submitted = stubbed.replace(merge_task.stub_body, body, 1)
    checked = screen(merge_task, submitted, stubbed, original)
    assert checked.flags and checked.def_range   # the screen alone would already refuse it
    dest = Path(WORK_ROOT) / f"verify-tamper-{tmp_path.name}"
    build_verify_tree(merge_task, submitted, pristine, dest)
    try:
        run = run_tests(Sandbox(dest, uid=UID, limits=Limits(), workdir_readonly=True), merge_task.test_command,
                        target=(f"{INSIDE_REPO}/{merge_task.module_path}", *checked.def_range), timeout_s=120)
    finally:
        import shutil
        shutil.rmtree(dest)
    assert run.refused, (run.tampered, run.output[-2000:])
    assert not any(run.outcomes.get(t) == "passed" for t in merge_task.fail_to_pass[:1]) or run.refused


@pytest.mark.heavy
def test_every_shipped_task_still_scores_full_with_its_reference_body():
    """The checks must not hurt a clean library: original body -> 1.0 on every shipped task."""
    from envs.tasks import SHIPPED_TASKS, load_tasks
    bad = {}
    for path in sorted(SHIPPED_TASKS.glob("*.jsonl")):
        for task in load_tasks(path):
            with episode(task, sandbox_uid_base=UID) as env:
                replace_body(env, task.original_body)
                r = env.reward()
            if r.reward != 1.0:
                bad[task.id] = (r.reward, r.error, r.flags)
    assert not bad, bad
