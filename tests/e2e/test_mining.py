"""Task mining on the real toolz sdist (sandboxed), task records, and the train/test firewall."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from envs.mining import function_candidates, mine
from envs.screen import find_function
from envs.sdist import lookup, pristine_tree
from envs.split import TrainedOnError, assert_not_trained_on, load_split, write_split
from envs.tasks import Task, load_tasks, save_tasks
from tests.fixtures.env import SHIPPED_TOOLZ, WORK_ROOT


@pytest.fixture(scope="module")
def mined():
    return mine("toolz", limit=3, work_root=WORK_ROOT, workers=1)


def _docstring(source: str, qualname: str) -> str | None:
    """The docstring of a function or method ("f" or "Class.method")."""
    node = find_function(ast.parse(source), qualname)
    if node is None:
        raise LookupError(qualname)
    return ast.get_docstring(node)


def test_mined_tasks_are_complete_and_consistent(mined):
    tasks, report = mined
    assert len(tasks) >= 1 and report.stable_tests > 100 and report.functions > 50
    info = lookup("toolz", tasks[0].version)
    tree = pristine_tree(info)
    for t in tasks:
        assert t.fail_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert len(t.fail_to_pass) + len(t.pass_to_pass) == report.stable_tests
        original = (tree / t.module_path).read_text()
        stubbed = t.stubbed_source(original)
        assert stubbed != original and "NotImplementedError" in stubbed
        assert _docstring(stubbed, t.qualname) == _docstring(original, t.qualname)   # docstring kept
        assert t.solved_source(stubbed) == original
        assert t.qualname in t.problem_statement and t.module_path in t.problem_statement
        assert Task.from_json(t.to_json()) == t
        # the differential gate's inputs were recorded (or the task says why there are none)
        assert {"calls", "perturbed", "seen", "note"} <= set(t.gate) and (t.gate["calls"] or t.gate["note"]), t.gate
    assert any(t.gate["calls"] for t in tasks) or all(t.gate["note"] for t in tasks)


def test_mining_matches_the_shipped_task_file(mined):
    if not SHIPPED_TOOLZ.exists():
        pytest.skip("no shipped task file to compare with")
    shipped = {t.id: t for t in load_tasks(SHIPPED_TOOLZ)}
    for t in mined[0]:
        if t.id in shipped:
            assert t.fail_to_pass == shipped[t.id].fail_to_pass


def test_candidate_filters(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(
        'def one_liner(x): return x\n\n'
        'def short(x):\n    """Doc."""\n    return x\n\n'
        'def real(x):\n    """Doc."""\n    y = x + 1\n    return y\n\n'
        'class C:\n    def method(self):\n        a = 1\n        return a\n')
    (pkg / "test_mod.py").write_text("def test_real():\n    a = 1\n    assert a\n")
    cands = function_candidates(tmp_path, ["pkg"])
    by_name = {c.qualname: c for c in cands}
    assert set(by_name) == {"short", "real", "C.method"}   # one-liners and test files are not candidates
    assert by_name["real"].body == "    y = x + 1\n    return y\n"


def test_load_tasks_errors_are_clear(tmp_path, mined):
    with pytest.raises(FileNotFoundError, match="rlvr tasks mine"):
        load_tasks(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(mined[0][0].to_json() + "\n" + json.dumps({"id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a task record: missing \["):
        load_tasks(bad)
    good = tmp_path / "good.jsonl"
    save_tasks(mined[0], good)
    assert load_tasks(good) == mined[0]


def _fake_tasks(n: int) -> list[Task]:
    return [Task(id=f"lib:m.py:f{i}", library="lib", version="1", sdist_filename="x", sdist_sha256="0",
                 sdist_url="u", module_path="m.py", qualname=f"f{i}", body_start_line=1, body_end_line=1,
                 original_body="", stub_body="", fail_to_pass=["t"], pass_to_pass=[], test_command=[],
                 problem_statement="") for i in range(n)]


def test_split_is_written_once_and_guards_evaluation(tmp_path):
    tasks = _fake_tasks(20)
    split = write_split(tmp_path, tasks, 0.8, seed=1)
    assert len(split.train) == 16 and len(split.test) == 4 and not set(split.train) & set(split.test)
    assert write_split(tmp_path, list(reversed(tasks)), 0.8, seed=1) == split     # resuming: same split
    with pytest.raises(ValueError, match="already holds a different split"):
        write_split(tmp_path, tasks, 0.8, seed=2)
    assert load_split(tmp_path) == split
    assert_not_trained_on(tmp_path, split.test)
    with pytest.raises(TrainedOnError, match="trained on"):
        assert_not_trained_on(tmp_path, [split.test[0], split.train[0]])
    with pytest.raises(FileNotFoundError, match="written when training starts"):
        assert_not_trained_on(Path(tmp_path) / "other-run", split.test)
