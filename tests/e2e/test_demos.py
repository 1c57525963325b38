"""Demonstrations on the real sandbox: direct and recovery variants reach reward 1.0, every
observation is the real tool output (a replay on a fresh checkout gives the same), and the
conversation ends with an answer, so the stop is trained."""
from __future__ import annotations

import json
import re

import pytest

from envs.coding_env import CodingEnv
from envs.tasks import SHIPPED_TASKS, load_tasks
from scaffolds.demos import build_demonstration, function_end, unique_old_text
from tests.fixtures.env import env_cfg, toolz_tasks

UID = 63700
# a fresh machine's first test run in a checkout byte-compiles pytest and the test deps: allow
# more than the suite's usual 10 s per command (the reward's own clock is unchanged)
DEMO_ENV = dict(command_timeout_s=60.0)
VOLATILE = re.compile(r"in \d+\.\d+s|0x[0-9a-f]+")   # pytest's timing line, object addresses


@pytest.fixture(scope="module")
def tasks():
    return toolz_tasks()[:2]


def replay(task, demo) -> tuple[list[str], float]:
    """Run the demonstration's tool calls again on a fresh checkout: (observations, reward)."""
    with CodingEnv(task, env_cfg().work_root, env_cfg(**DEMO_ENV), uid=UID + 1) as env:
        seen = []
        for m in demo.messages:
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                seen.append(env.call_tool(fn["name"], json.loads(fn["arguments"])).content)
        return seen, env.reward().reward


def assert_derived_from_observations(demo) -> None:
    """Every argument the model must write is in the task statement or an earlier observation:
    the read offset is a line number grep printed, the first edit's oldText is in the read's
    output, and the test command names no test id."""
    calls = [(json.loads(c["function"]["arguments"]), c["function"]["name"]) for m in demo.messages
             for c in m.get("tool_calls") or []]
    observations = [m["content"] for m in demo.messages if m["role"] == "tool"]
    (grep, first), (read, second) = calls[:2]
    assert first == "bash" and grep["command"].startswith("grep -n ") and second == "read"
    assert re.search(rf"^{read['offset']}:", observations[0], re.M), (read, observations[0])
    edit = next(args for args, name in calls if name == "edit")
    assert edit["edits"][0]["oldText"] in observations[1]
    assert all("::" not in args["command"] for args, name in calls if name == "bash")


@pytest.mark.parametrize("recovery", [False, True])
def test_demonstrations_are_verified_and_replay(tasks, recovery):
    task = tasks[0]
    demo = build_demonstration(task, env_cfg(**DEMO_ENV), uid=UID, seed=0, recovery=recovery)
    assert demo is not None and demo.reward == 1.0, demo and demo.notes
    roles = [m["role"] for m in demo.messages]
    assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
    assert "tool_calls" not in demo.messages[-1] and demo.messages[-1]["content"]
    observations = [m["content"] for m in demo.messages if m["role"] == "tool"]
    edits = [c for m in demo.messages for c in m.get("tool_calls") or [] if c["function"]["name"] == "edit"]
    assert len(edits) == (2 if recovery else 1)
    if recovery:   # a wrong edit, its failing test output, then the fix
        assert any(re.search(r"\d+ (failed|error)", o) for o in observations)
    assert re.search(r"\d+ passed", observations[-1]) and "failed" not in observations[-1]
    assert_derived_from_observations(demo)
    again, reward = replay(task, demo)
    assert reward == 1.0
    assert [VOLATILE.sub("", o) for o in again] == [VOLATILE.sub("", o) for o in observations]


def test_unique_old_text_widens_to_the_target_occurrence():
    text = "def a():\n    return None\n\n\ndef b(x):\n    return None\n"
    assert unique_old_text(text, "    return None", 6) == "def b(x):\n    return None"
    assert unique_old_text(text, "def b(x):", 5) == "def b(x):"


@pytest.mark.parametrize("level", ["last_lines", "branch", "return", "statement"])
def test_demonstrations_of_partial_stubs(level):
    """A partial stub's edit replaces the marked hole with the removed code: the reward is 1.0,
    and the read window shows the whole function, the code after the hole included."""
    task = next(t for t in load_tasks(SHIPPED_TASKS / "toolz-levels.jsonl") if t.level == level)
    demo = build_demonstration(task, env_cfg(**DEMO_ENV), uid=UID, seed=0, recovery=level == "branch")
    assert demo is not None and demo.reward == 1.0, demo and demo.notes
    assert_derived_from_observations(demo)
    reads = [json.loads(c["function"]["arguments"]) for m in demo.messages for c in m.get("tool_calls") or []
             if c["function"]["name"] == "read"]
    with CodingEnv(task, env_cfg().work_root, env_cfg(**DEMO_ENV), uid=UID + 1) as env:
        end = function_end(task, (env.checkout / task.module_path).read_text())
    assert reads and reads[0]["offset"] + reads[0]["limit"] > end


@pytest.mark.parametrize("flags", [{}, {"recovery": True}, {"tests_first": True, "explore": False}])
def test_demonstrations_of_mutants(flags):
    """A one-token bug: the edit's oldText is the mutant line as the task statement quotes it,
    its newText the original line; a recovery first tries another one-token change that the
    tests reject; a tests-first demonstration reads the failing run before anything else."""
    task = load_tasks(SHIPPED_TASKS / "cachetools-mutation.jsonl")[0]
    recovery = flags.get("recovery", False)
    demo = build_demonstration(task, env_cfg(**DEMO_ENV), uid=UID, seed=0, recovery=recovery,
                               **{k: v for k, v in flags.items() if k != "recovery"})
    assert demo is not None and demo.reward == 1.0, demo and demo.notes
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for m in demo.messages
             for c in m.get("tool_calls") or []]
    observations = [m["content"] for m in demo.messages if m["role"] == "tool"]
    edits = [args["edits"][0] for name, args in calls if name == "edit"]
    assert len(edits) == (2 if recovery else 1)
    assert edits[0]["oldText"] == task.stub_body.strip() and edits[0]["oldText"] in task.problem_statement
    assert edits[-1]["newText"] == task.original_body.strip()
    if flags.get("tests_first"):
        assert calls[0][0] == "bash" and re.search(r"\d+ failed", observations[0])
        assert calls[1][0] == "read"        # no grep: the statement names the line
    again, reward = replay(task, demo)
    assert reward == 1.0
