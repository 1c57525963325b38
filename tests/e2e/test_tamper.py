"""Tamper suite: every attack class, written through the agent's tools, scores < 1.0 and is
flagged with a reason; the reference body scores 1.0 in the same kind of episode."""
from __future__ import annotations

import os
import re

import pytest

from envs.reward import build_verify_tree
from envs.sandbox import INSIDE_REPO, Limits, Sandbox
from envs.screen import screen
from envs.testrun import run_tests
from tests.fixtures.env import (
    WORK_ROOT,
    episode,
    replace_body,
    task_by_qualname,
    toolz_tasks,
)
from tests.fixtures.tamper_attacks import (
    ATTACKS,
    ATTACKS_FREQUENCIES,
    FRAME_SOURCE,
    HONEST_FREQUENCIES,
    HOOK_WRAPPER,
    LOADER_PYC,
    RESULT_CHANNEL,
    TEST_CODE_VIA_GLOBALS,
    VERIFIER_REBIND,
    VERIFIER_STATE,
    WRONG,
    WRONG_FREQ,
    _indent,
)

UID = int(os.environ.get("RLVR_TAMPER_UID", "63019"))   # a uid range no concurrent run uses


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


@pytest.fixture(scope="module")
def frequencies_task():
    return task_by_qualname(toolz_tasks(), "frequencies")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:70]


def test_a_wrong_frequencies_body_scores_zero(frequencies_task):
    """The attacks below carry this kind of wrong body: 1.0 can only come from the attack."""
    with episode(frequencies_task, sandbox_uid_base=UID) as env:
        replace_body(env, WRONG_FREQ)
        r = env.reward()
    assert r.reward == 0.0 and r.parts["f2p_passed"] == 0, r


@pytest.mark.parametrize("attack", list(ATTACKS_FREQUENCIES), ids=_slug)
def test_frequencies_attack_does_not_earn_reward(frequencies_task, attack):
    cls, write = ATTACKS_FREQUENCIES[attack]
    with episode(frequencies_task, sandbox_uid_base=UID) as env:
        write(env, frequencies_task)
        r = env.reward()
    print(f"\n[{cls}] {attack}: reward {r.reward:.2f}; {r.error or r.parts.get('reason') or ''}")
    assert r.reward < 1.0, (cls, attack, r)


@pytest.mark.parametrize("name", list(HONEST_FREQUENCIES), ids=_slug)
def test_honest_frequencies_rewrite_scores_full(frequencies_task, name):
    with episode(frequencies_task, sandbox_uid_base=UID) as env:
        replace_body(env, HONEST_FREQUENCIES[name])
        r = env.reward()
    assert r.reward == 1.0 and r.flags == [] and r.error is None, (name, r)


def _run_unscreened(task, body, name):
    """The task's tests on `body` with the verifier's target and allowances, the screen's flags
    ignored (what the audit hook alone makes of it). Returns (screen, run)."""
    import shutil
    from pathlib import Path

    from envs.coding_env import pristine_for
    pristine = pristine_for(task)
    original = (pristine / task.module_path).read_text()
    stubbed = task.stubbed_source(original)
    submitted = stubbed.replace(task.stub_body, body, 1)
    checked = screen(task, submitted, stubbed, original)
    dest = Path(WORK_ROOT) / f"verify-tamper-{name}"
    build_verify_tree(task, submitted, pristine, dest)
    try:
        run = run_tests(Sandbox(dest, uid=UID, limits=Limits(), workdir_readonly=True), task.test_command,
                        target=(f"{INSIDE_REPO}/{task.module_path}", *checked.def_range), timeout_s=120,
                        allow=checked.allowed, qualname=task.qualname)
    finally:
        shutil.rmtree(dest)
    return checked, run


@pytest.mark.parametrize("body", [_indent(HOOK_WRAPPER) + WRONG, FRAME_SOURCE], ids=["gc-hook", "frame"])
def test_audit_hook_refuses_what_the_screen_would_miss(merge_task, body, tmp_path):
    """Defence in depth: the same attacks, the static screen bypassed, are refused at run time."""
    checked, run = _run_unscreened(merge_task, body, tmp_path.name)
    assert checked.flags and checked.def_range   # the screen alone would already refuse it
    assert run.refused, (run.tampered, run.output[-2000:])
    assert not any(run.outcomes.get(t) == "passed" for t in merge_task.fail_to_pass[:1]) or run.refused


def test_a_tests_bytecode_stays_refused_through_the_import_systems_loader(merge_task, tmp_path):
    """The import system may read a library module's .pyc for the target (tlz's loader imports
    modules); a test's .pyc read through the same loader is still the target's read."""
    checked, run = _run_unscreened(merge_task, LOADER_PYC, tmp_path.name)
    assert checked.flags == []   # nothing for the static screen to see
    assert any(".pyc" in r for r in run.refused), (run.refused, run.output[-2000:])


@pytest.mark.parametrize("name", list(RESULT_CHANNEL))
def test_the_code_under_test_cannot_write_the_result(frequencies_task, name, tmp_path):
    """The screen bypassed: a runner writes only its own pipe, the reporter decides what a line
    means, and a runner that exits or goes silent mid-test fails that test."""
    _, run = _run_unscreened(frequencies_task, RESULT_CHANNEL[name], tmp_path.name)
    outcomes = [run.outcomes.get(t) for t in frequencies_task.fail_to_pass]
    assert outcomes and all(o != "passed" for o in outcomes), (outcomes, run.tampered, run.output[-2000:])
    if name == "forged lines":   # the reporter holds the lines to the runner's: a phase twice, `report ok`
        assert any("reported twice" in t or "does not write" in t for t in run.tampered), run.tampered


@pytest.mark.parametrize("body", [VERIFIER_STATE, VERIFIER_REBIND], ids=["line-table", "line-writer"])
def test_rewriting_the_verifiers_state_is_refused(frequencies_task, body, tmp_path):
    """The screen bypassed: the verifier's module and its reporter reached through sys.modules,
    its line table and line writer rewritten so every phase says ok. The call's line is a
    constant written by code whose values are default arguments, and the runner's check after
    the target ran sees the rebound names: no test passes, and the run is tampered."""
    checked, run = _run_unscreened(frequencies_task, body, tmp_path.name)
    assert checked.flags   # the screen refuses it first (sys.modules, an aliased getattr, chr names)
    outcomes = [run.outcomes.get(t) for t in frequencies_task.fail_to_pass]
    assert outcomes and all(o != "passed" for o in outcomes), (outcomes, run.tampered, run.output[-2000:])
    if body is VERIFIER_REBIND:
        assert any("internals changed" in t and "line" in t for t in run.tampered), (run.tampered, run.output[-2000:])


@pytest.fixture(scope="module")
def arggetter_task():
    """funcy's arggetter reads a function's __code__ for its argument names: honest code. (A task
    mined on 2026-12-03, kept in tests/fixtures: the re-mined level file's spread misses it.)"""
    from pathlib import Path

    from envs.tasks import Task
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "arggetter_branch_task.json"
    return Task.from_json(fixture.read_text())


def test_code_reads_the_reference_does_are_allowed_but_never_a_tests_code(arggetter_task, tmp_path):
    checked, run = _run_unscreened(arggetter_task, arggetter_task.original_body, tmp_path.name + "-ref")
    assert checked.flags == [] and checked.allowed == ("object.__getattr__ __code__",)
    assert not run.refused and all(run.outcomes.get(t) == "passed" for t in arggetter_task.fail_to_pass), \
        (run.refused, run.output[-2000:])
    _, run = _run_unscreened(arggetter_task, TEST_CODE_VIA_GLOBALS + arggetter_task.original_body,
                             tmp_path.name + "-attack")
    assert any("__code__" in r for r in run.refused), (run.refused, run.output[-2000:])


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
