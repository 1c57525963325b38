"""Mining what real libraries do: tests that run the library's CLI in a subprocess (coverage
cannot see the child: the full-suite run on each stub moves them to FAIL_TO_PASS), and tests
that need a test-only dependency (a baseline with no test names the missing module)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from envs.mining import mine_tree
from envs.reward import compute_reward
from envs.sandbox import Limits
from envs.sdist import SdistInfo
from envs.tasks import LEVELS
from envs.testdeps import overlay_for, overlay_for_sdist
from tests.fixtures.env import WORK_ROOT

CLI_PKG = {
    "shout/__init__.py": "",
    "shout/core.py": "def shout(text):\n    upper = text.upper()\n    return upper + '!'\n",
    "shout/__main__.py": "import sys\nfrom shout.core import shout\nprint(shout(sys.argv[1]))\n",
    "tests/test_core.py": "from shout.core import shout\n\ndef test_shout():\n    assert shout('hi') == 'HI!'\n\n"
                          "".join(f"def test_unrelated_{i}():\n    assert {i} + 1 == {i + 1}\n\n" for i in range(3)),
    "tests/test_cli.py": "import subprocess, sys\n\ndef test_cli():\n"
                         "    out = subprocess.run([sys.executable, '-m', 'shout', 'hey'], capture_output=True, text=True)\n"
                         "    assert out.stdout.strip() == 'HEY!'\n",
}


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    top = Path(WORK_ROOT) / f"minetree-{tmp.name}" / "lib-1.0"
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
    for root, dirs, names in os.walk(top.parent):
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o755)
    os.chmod(top.parent, 0o755)
    return top


def test_subprocess_cli_tests_move_to_fail_to_pass(tmp_path):
    tree = _tree(tmp_path, CLI_PKG)
    info = SdistInfo("shout", "1.0", "shout-1.0.tar.gz", "0" * 64, "file:///none")
    progress = Path(WORK_ROOT) / f"progress-{tmp_path.name}.jsonl"
    tasks, report = mine_tree(info, tree, work_root=WORK_ROOT, uid_base=63030, workers=1, timeout_s=120,
                              progress=progress)
    assert [t.qualname for t in tasks] == ["shout"], report
    t = tasks[0]
    assert t.fail_to_pass == ["tests/test_cli.py::test_cli", "tests/test_core.py::test_shout"], t
    assert t.pass_to_pass == [f"tests/test_core.py::test_unrelated_{i}" for i in range(3)]
    assert t.meta["f2p_outside_coverage"] == ["tests/test_cli.py::test_cli"]
    logs = []   # a rerun (e.g. after a kill) takes the probes already made from the progress file
    again, _ = mine_tree(info, tree, work_root=WORK_ROOT, uid_base=63030, workers=1, timeout_s=120,
                         progress=progress, log=logs.append)
    assert again == tasks and any("resuming: 1 stubs already probed" in line for line in logs), logs
    progress.unlink()


def test_missing_test_dependency_is_named(tmp_path):
    files = dict(CLI_PKG)
    files["tests/test_core.py"] = "import freezegun_not_installed\n" + files["tests/test_core.py"]
    files["tests/test_cli.py"] = "import freezegun_not_installed\n" + files["tests/test_cli.py"]
    tree = _tree(tmp_path, files)
    info = SdistInfo("shout", "1.0", "shout-1.0.tar.gz", "0" * 64, "file:///none")
    with pytest.raises(RuntimeError, match="collected no test") as err:
        mine_tree(info, tree, work_root=WORK_ROOT, uid_base=63030, workers=1, timeout_s=120)
    assert "lacks: freezegun_not_installed" in str(err.value) and "tests/test_core.py" in str(err.value)
    assert "rlvr tasks mine shout --test-deps freezegun_not_installed" in str(err.value)


def test_files_that_do_not_collect_are_named_and_the_rest_is_mined(tmp_path):
    files = dict(CLI_PKG)
    files["tests/test_time.py"] = "import freezegun_not_installed\n\ndef test_t():\n    pass\n"
    tree = _tree(tmp_path, files)
    info = SdistInfo("shout", "1.0", "shout-1.0.tar.gz", "0" * 64, "file:///none")
    logs = []
    tasks, _ = mine_tree(info, tree, work_root=WORK_ROOT, uid_base=63030, workers=1, timeout_s=120,
                         log=logs.append)
    assert [t.qualname for t in tasks] == ["shout"]
    assert any("tests/test_time.py" in line and "freezegun_not_installed" in line for line in logs), logs


FROZEN_PKG = {
    "PKG-INFO": ("Metadata-Version: 2.1\nName: stamp\nVersion: 1.0\nProvides-Extra: tests\n"
                 "Requires-Dist: freezegun; extra == \"tests\"\nRequires-Dist: pytest; extra == \"tests\"\n"),
    "stamp/__init__.py": "",
    "stamp/core.py": ("import datetime\n\n\ndef year_label(prefix):\n    today = datetime.date.today()\n"
                      "    label = prefix.upper()\n    return label + '-' + str(today.year)\n"),
    "tests/test_core.py": ("import freezegun\nfrom stamp.core import year_label\n\n\n"
                           "@freezegun.freeze_time('2001-02-03')\ndef test_year_label():\n"
                           "    assert year_label('y') == 'Y-2001'\n\n"
                           + "".join(f"def test_unrelated_{i}():\n    assert {i} + 1 == {i + 1}\n\n" for i in range(3))),
}


def test_declared_test_dependency_goes_into_an_overlay_the_reward_uses(tmp_path):
    """freezegun, declared in the sdist's `tests` extra, is installed into a read-only overlay
    (never the locked pytest); the tasks record its pins, and the reward needs the overlay."""
    tree = _tree(tmp_path, FROZEN_PKG)
    overlay = overlay_for_sdist(tree)
    names = {p.split("==")[0] for p in overlay.pins}
    assert "freezegun" in names and "pytest" not in names, overlay.pins
    assert overlay_for(list(overlay.pins)).path == overlay.path          # what a task rebuilds
    info = SdistInfo("stamp", "1.0", "stamp-1.0.tar.gz", "0" * 64, "file:///none")
    tasks, report = mine_tree(info, tree, work_root=WORK_ROOT, uid_base=63030, workers=1, timeout_s=120,
                              levels=LEVELS, overlay=overlay)
    assert {t.level for t in tasks} >= {"body", "return"}, report
    for t in tasks:
        assert t.fail_to_pass == ["tests/test_core.py::test_year_label"] and t.test_deps == list(overlay.pins)
    task = next(t for t in tasks if t.level == "body")
    checkout = Path(WORK_ROOT) / f"overlay-checkout-{tmp_path.name}"
    import shutil
    shutil.copytree(tree, checkout)
    (checkout / task.module_path).write_text((tree / task.module_path).read_text().replace("upper", "lower"))
    args = (task, checkout, tree, Path(WORK_ROOT), 63031, Limits(), 120.0, 10.0)
    assert compute_reward(*args, site_overlay=overlay.path).reward == 0.0   # a wrong body fails
    (checkout / task.module_path).write_text((tree / task.module_path).read_text())
    assert compute_reward(*args, site_overlay=overlay.path).reward == 1.0   # the reference passes
    assert compute_reward(*args).reward == 0.0                               # ... only with the overlay
    shutil.rmtree(checkout)


MUT_PKG = {
    "mut/__init__.py": "",
    "mut/core.py": ("def clamp(x, hi):\n    if x > hi:\n        return hi\n    return x\n\n\n"
                    "def describe(obj):\n    label = str(obj)\n    return label\n\n\n"
                    "def head(seq):\n    items = list(seq)\n    return items[0]\n"),
    "tests/test_core.py": ("from mut.core import clamp, describe, head\n\n"
                           "def test_clamp_low():\n    assert clamp(5, 10) == 5\n\n"
                           "def test_clamp_high():\n    assert clamp(50, 10) == 10\n\n"
                           "def test_describe():\n    assert describe(1)\n\n"
                           "def test_head():\n    assert head([7]) == 7\n\n"
                           + "".join(f"def test_unrelated_{i}():\n    assert {i} + 1 == {i + 1}\n\n" for i in range(3))),
}


def test_mutants_are_verified_like_stubs(tmp_path):
    """A one-token mutant is a task only when some test fails on it, the rest pass, and the
    failure compares expected with actual: clamp's mutants are kept; describe's only mutant
    (`return obj`) passes its test and is refused; head's (`items[1]`) only raises IndexError."""
    from envs.stubs import candidates

    tree = _tree(tmp_path, MUT_PKG)
    cands = {(c.qualname, c.operator): c for c in candidates(tree, ["mut"], "", ("mutation",))}
    assert ("describe", "wrong_return") in cands and ("head", "off_by_one") in cands, cands
    info = SdistInfo("mut", "1.0", "mut-1.0.tar.gz", "0" * 64, "file:///none")
    tasks, report = mine_tree(info, tree, work_root=WORK_ROOT, uid_base=63030, workers=1, timeout_s=120,
                              levels=("mutation",))
    assert tasks and {t.qualname for t in tasks} == {"clamp"}, report
    unrelated = [f"tests/test_core.py::test_unrelated_{i}" for i in range(3)]
    for t in tasks:
        assert t.level == "mutation" and t.body_start_line == t.body_end_line and t.id.endswith(f"@{t.body_start_line}")
        assert t.stub_body != t.original_body and t.stub_body.strip() in t.problem_statement
        assert set(t.fail_to_pass) <= {"tests/test_core.py::test_clamp_low", "tests/test_core.py::test_clamp_high"}
        assert set(unrelated) <= set(t.pass_to_pass) and "tests/test_core.py::test_describe" in t.pass_to_pass
    task = tasks[0]
    checkout = Path(WORK_ROOT) / f"mutant-checkout-{tmp_path.name}"
    import shutil
    shutil.copytree(tree, checkout)
    original = (tree / task.module_path).read_text()
    (checkout / task.module_path).write_text(task.stubbed_source(original))
    args = (task, checkout, tree, Path(WORK_ROOT), 63031, Limits(), 120.0, 10.0)
    assert compute_reward(*args).reward < 1.0                  # the mutant fails its tests
    (checkout / task.module_path).write_text(original)
    assert compute_reward(*args).reward == 1.0                 # the one-line fix passes
    shutil.rmtree(checkout)
