"""Difficulty levels: where each level's stub goes, that every stub compiles and is unique in its
module, methods as well as functions, and task records carrying their level."""
from __future__ import annotations

import ast
import json

import pytest

from envs.screen import screen
from envs.stubs import candidates, problem_statement, stub_for
from envs.tasks import LEVELS, Task
from envs.testdeps import declared

MODULE = '''\
import math


def area(shape, size):
    """Area of a shape."""
    if shape == "square":
        side = size * 1.0
        return side * side
    elif shape == "circle":
        r = size / 2
        return math.pi * r * r
    scale = size ** 2
    total = scale + 0
    return total * 0.5


class Box:
    def __init__(self, w, h):
        self.w = w
        self.h = h

    def volume(self, depth):
        base = self.w * self.h
        if depth < 0:
            raise ValueError("negative depth")
        result = base * depth
        return result + 0 * sum([base, depth])


def one(x): return x
'''


@pytest.fixture()
def tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "geo.py").write_text(MODULE)
    return tmp_path


def test_every_level_has_a_span_in_a_real_function(tree):
    cands = candidates(tree, ["pkg"], levels=LEVELS)
    got = {(c.qualname, c.level): (c.start, c.end) for c in cands}
    assert got[("area", "body")] == (6, 14)
    assert got[("area", "return")] == (11, 11)             # the largest return expression
    assert got[("area", "branch")] in {(7, 8), (10, 11)}    # one branch body, never the whole function
    assert got[("area", "last_lines")] == (12, 14)          # about a third of the body, at a boundary
    assert ("area", "statement") in got
    assert got[("Box.volume", "body")] == (23, 27)          # methods are candidates
    assert got[("Box.volume", "branch")] == (25, 25)
    assert got[("Box.volume", "return")] == (27, 27)
    assert not any(q == "one" for q, _ in got)              # a body on the def line is not
    lines = MODULE.splitlines(keepends=True)
    for c in cands:
        assert c.body == "".join(lines[c.start - 1:c.end]) and c.fn_start <= c.start <= c.end <= c.fn_end
        stubbed = "".join(lines[:c.start - 1]) + stub_for(c) + "".join(lines[c.end:])
        ast.parse(stubbed)
        assert stubbed.count(stub_for(c).strip()) == 1
        assert c.qualname in problem_statement(c)


def test_levels_filter_and_unknown_level(tree):
    assert {c.level for c in candidates(tree, ["pkg"])} == {"body"}
    assert {c.level for c in candidates(tree, ["pkg"], levels=("return",))} == {"return"}
    with pytest.raises(ValueError, match="unknown difficulty level"):
        candidates(tree, ["pkg"], levels=("lines",))


def _task(c, source: str) -> Task:
    suffix = f"@{c.start}" if c.level == "mutation" else ""
    return Task(id=f"pkg:{c.qualname}:{c.level}{suffix}", library="pkg", version="1", sdist_filename="x", sdist_sha256="0",
                sdist_url="u", module_path=c.module_path, qualname=c.qualname, body_start_line=c.start,
                body_end_line=c.end, original_body=c.body, stub_body=stub_for(c), fail_to_pass=["t"],
                pass_to_pass=[], test_command=[], problem_statement=problem_statement(c), level=c.level)


def test_partial_stubs_pass_the_target_function_screen(tree):
    """The reward's target-function-only check accepts the reference at every level (and a
    rewrite of the whole function), and refuses a change outside the function."""
    for c in candidates(tree, ["pkg"], levels=LEVELS):
        t = _task(c, MODULE)
        stubbed = t.stubbed_source(MODULE)
        assert t.solved_source(stubbed) == MODULE
        assert screen(t, MODULE, stubbed, MODULE).flags == []
        outside = MODULE.replace("import math\n", "import math\nX = 1\n")
        assert screen(t, outside, stubbed, MODULE).flags
    # the docstring is not the body: its doctests can be the suite's tests (--doctest-modules)
    t = _task(next(c for c in candidates(tree, ["pkg"]) if c.qualname == "area"), MODULE)
    assert screen(t, MODULE.replace("Area of", "The area of"), t.stubbed_source(MODULE), MODULE).flags == []
    doctested = MODULE.replace('"""Area of a shape."""', '"""Area.\n\n    >>> 2\n    2\n    """')
    t = _task(next(c for c in candidates_from(doctested) if c.qualname == "area" and c.level == "body"), doctested)
    redoc = doctested.replace(">>> 2\n    2", ">>> 2\n    3")
    assert "docstring with doctests stays" in screen(t, redoc, t.stubbed_source(doctested), doctested).flags[0]
    t = _task(next(c for c in candidates(tree, ["pkg"]) if c.qualname == "Box.volume"), MODULE)
    added = MODULE.replace("        base = self.w", '        """Volume."""\n        base = self.w')
    assert screen(t, added, t.stubbed_source(MODULE), MODULE).flags == []   # a new docstring is fine

    # the name the tests import must stay the edited function: no new import binding it, none after it
    t = _task(next(c for c in candidates(tree, ["pkg"]) if c.qualname == "area"), MODULE)
    stubbed = t.stubbed_source(MODULE)
    assert screen(t, MODULE.replace("import math\n", "import math\nimport os\n"), stubbed, MODULE).flags == []
    rebound = MODULE.replace("import math\n", "import math\nfrom statistics import mean as area\n")
    assert any("binds `area`" in f for f in screen(t, rebound, stubbed, MODULE).flags)
    late = MODULE.replace("\n\nclass Box:", "\nfrom collections import Counter as area\n\nclass Box:")
    assert any("binds `area`" in f for f in screen(t, late, stubbed, MODULE).flags)
    after = MODULE.replace("\n\nclass Box:", "\nimport os\n\nclass Box:")
    assert any("comes after `area`" in f for f in screen(t, after, stubbed, MODULE).flags)


def test_task_records_carry_their_level():
    c = next(c for c in candidates_from(MODULE) if c.level == "branch")
    t = _task(c, MODULE)
    assert Task.from_json(t.to_json()) == t and json.loads(t.to_json())["level"] == "branch"
    old = json.loads(t.to_json())
    del old["level"], old["test_deps"]
    assert Task.from_json(old).level == "body"             # task files from before levels still load
    with pytest.raises(ValueError, match="unknown level"):
        Task.from_json(dict(old, level="lines"))


def candidates_from(source: str):
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "pkg").mkdir()
        (Path(d) / "pkg" / "__init__.py").write_text("")
        (Path(d) / "pkg" / "geo.py").write_text(source)
        return candidates(Path(d), ["pkg"], levels=LEVELS)


def test_declared_test_dependencies(tmp_path):
    (tmp_path / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: lib\nVersion: 1.0\nRequires-Dist: attrs>=20\n"
        "Requires-Dist: freezegun; extra == \"tests\"\nRequires-Dist: pytest>=7; extra == \"tests\"\n"
        "Requires-Dist: sphinx; extra == \"docs\"\nRequires-Dist: mypy; extra == \"dev\"\n"
        "Requires-Dist: tomli; python_version < \"3.8\"\nProvides-Extra: tests\nProvides-Extra: docs\n"
        "Provides-Extra: dev\n")
    (tmp_path / "pyproject.toml").write_text('[dependency-groups]\ntest = ["hypothesis>=6", {include-group = "x"}]\n')
    (tmp_path / "requirements-test.txt").write_text("# tests\nresponses==0.25\n-r other.txt\n")
    reqs, sources = declared(tmp_path)
    # runtime + the tests extra + the test group + the requirements file; never the locked pytest,
    # docs, dev tools when a tests extra exists, or a marker that is false here
    assert reqs == ["attrs>=20", "freezegun", "hypothesis>=6", "responses==0.25"], reqs
    assert "requirements-test.txt" in sources and "pyproject.toml dependency-groups.test" in sources
    (tmp_path / "bare").mkdir()
    assert declared(tmp_path / "bare") == ([], [])


def test_task_levels_filter_selects_before_the_split(tmp_path):
    from envs.split import select_tasks
    from envs.tasks import save_tasks
    from rl.config import ConfigError, TaskConfig
    cands = candidates_from(MODULE)
    path = tmp_path / "mixed.jsonl"
    save_tasks([_task(c, MODULE) for c in cands], path)
    cfg = TaskConfig(tasks_file=str(path), levels=["return", "branch"])
    picked = select_tasks(cfg, 0, tmp_path / "run", "train") + select_tasks(cfg, 0, tmp_path / "run", "test")
    assert sorted(t.level for t in picked) == sorted(c.level for c in cands if c.level in ("return", "branch"))
    bodies = tmp_path / "bodies.jsonl"
    save_tasks([_task(c, MODULE) for c in cands if c.level == "body"], bodies)
    with pytest.raises(ConfigError, match="no task of level"):
        select_tasks(TaskConfig(tasks_file=str(bodies), levels=["statement"]), 0, tmp_path / "run2", "train")


def test_task_levels_narrow_a_split_made_of_every_level(tmp_path):
    """Calibrating one level of a run whose split holds all levels reads that split (no new one)."""
    from envs.split import load_split, select_tasks
    from envs.tasks import save_tasks
    from rl.config import TaskConfig
    cands = candidates_from(MODULE)
    path = tmp_path / "mixed.jsonl"
    save_tasks([_task(c, MODULE) for c in cands], path)
    every = select_tasks(TaskConfig(tasks_file=str(path)), 0, tmp_path / "run", "train")
    before = load_split(tmp_path / "run")
    narrowed = select_tasks(TaskConfig(tasks_file=str(path), levels=["return"]), 0, tmp_path / "run", "train")
    assert narrowed and {t.level for t in narrowed} == {"return"}
    assert [t.id for t in narrowed] == [t.id for t in every if t.level == "return"]
    assert load_split(tmp_path / "run") == before
