"""The differential gate on a shipped task (toolz `frequencies`): candidate and original each in a
sandboxed process of their own, results compared as data. A body fitted to the tests' inputs and
a value whose comparison lies both fail it; the original body and honest rewrites pass it."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from envs.coding_env import pristine_for
from envs.gate import compare, gate_calls, link_tree, replace_module, run_gate
from envs.sandbox import Limits, Sandbox
from tests.fixtures.env import WORK_ROOT, task_by_qualname, toolz_tasks
from tests.fixtures.tamper_attacks import (
    ALIASED_TYPE,
    ALWAYS_EQUAL,
    CLASS_BODY_EQ,
    HONEST_FREQUENCIES,
    LOOKUP_TABLE,
    SMALL_INPUTS_ONLY,
)

UID = int(os.environ.get("RLVR_GATE_UID", "63023"))


@pytest.fixture(scope="module")
def task():
    t = task_by_qualname(toolz_tasks(), "frequencies")
    assert t.gate.get("calls") and t.gate.get("perturbed"), t.gate
    return t


@pytest.fixture(scope="module")
def original(task):
    """The original's results on the gate's inputs (one fresh process)."""
    pristine = pristine_for(task)
    tree = Path(WORK_ROOT) / f"gate-test-{uuid.uuid4().hex[:8]}"
    link_tree(pristine, tree)
    try:
        return run_gate(Sandbox(tree, uid=UID, limits=Limits(), workdir_readonly=True), tree, task.module_path,
                        task.qualname, gate_calls(task), 60)
    finally:
        shutil.rmtree(tree)


def _verdict(task, original, body: str):
    """The candidate with `body` in the target, in its own process, against the original."""
    pristine = pristine_for(task)
    tree = Path(WORK_ROOT) / f"gate-test-{uuid.uuid4().hex[:8]}"
    link_tree(pristine, tree)
    stubbed = task.stubbed_source((pristine / task.module_path).read_text())
    replace_module(tree, task.module_path, stubbed.replace(task.stub_body, body, 1))
    try:
        run = run_gate(Sandbox(tree, uid=UID + 1, limits=Limits(), workdir_readonly=True), tree, task.module_path,
                       task.qualname, gate_calls(task), 60)
    finally:
        shutil.rmtree(tree)
    return compare(original, run, len(gate_calls(task)), len(task.gate["calls"]))


def test_the_original_body_passes_the_gate(task, original):
    assert original.finished, original.error
    v = _verdict(task, original, task.original_body)
    assert v.fraction == 1.0 and v.error is None, v.summary()


@pytest.mark.parametrize("name", ["plain loop", "collections.Counter", "itertools.groupby after sorting "
                                  "(a loop when unsortable)"])
def test_honest_rewrites_pass_the_gate(task, original, name):
    v = _verdict(task, original, HONEST_FREQUENCIES[name])
    assert v.fraction == 1.0, v.summary()


@pytest.mark.parametrize("body", [LOOKUP_TABLE, SMALL_INPUTS_ONLY], ids=["lookup-table", "small-inputs-only"])
def test_a_body_fitted_to_the_tests_fails_the_gate(task, original, body):
    """Right on every input the tests use, wrong on the perturbed ones (grown past 50 items)."""
    v = _verdict(task, original, body)
    assert v.fraction < 1.0, v.summary()
    assert v.mismatches and all(m["kind"] == "perturbed" for m in v.mismatches), v.summary()
    assert all(m["kind"] == "perturbed" for m in v.mismatches)


@pytest.mark.parametrize("body", [ALWAYS_EQUAL, CLASS_BODY_EQ, ALIASED_TYPE],
                         ids=["def-eq", "class-body-eq", "type-eq"])
def test_a_value_whose_comparison_lies_fails_the_gate(task, original, body):
    """An empty dict whose __eq__ says True passes `==`; as data it is an empty dict."""
    v = _verdict(task, original, body)
    assert v.fraction < 1.0 and any(m["kind"] == "recorded" for m in v.mismatches), v.summary()
    assert '"map": []' in v.mismatches[0]["candidate"], v.mismatches[0]
