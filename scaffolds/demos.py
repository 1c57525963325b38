"""Demonstrations: execution-verified agent trajectories in pi's exact tools, built from a
task's reference body, for the warm-start SFT.

Every tool call of a demonstration runs through the real tools in the real sandbox, so each
observation is the real output, and a demonstration is kept only if the reward is 1.0.

Every step is something the model can do from what it has seen: a `grep -n` of the function
name from the task statement (or, without exploration, a read near the line the statement
names), a `read` at the line number that grep printed, an `edit` whose oldText is the stub's
text copied from that read (the constant `raise NotImplementedError`, or the mutant line the
statement quotes), and a test run of the tests folder. (Offsets the builder knows but the model
cannot see taught a small model to guess them; node ids of the FAIL_TO_PASS tests taught it to
invent ids.) The variants (VARIANTS, picked by the demonstration's index) differ in their
words, their read window, whether the failing tests are run and read first, whether the
function is looked up first, and, for a share of them, a *recovery*: a plausible but wrong
first edit, the failing test output, then the corrected edit (SFT on happy paths alone trains
recovery away). The last turn is a short answer with no tool call, so the end-of-turn token is
in the loss.

    demo = build_demonstration(task, env_cfg, uid=61500, seed=3, recovery=True)
    demo.messages   # system, user, assistant/tool turns, final answer (OpenAI chat format)
"""
from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envs.coding_env import INSIDE_REPO, CodingEnv
from envs.mutations import function_mutations
from envs.screen import find_function
from envs.tasks import Task
from envs.tools import PI_TOOLS
from scaffolds.system_prompt import render_system_prompt

OPENERS = ["", "Let me find the function first.", "I'll find the function.", "Let me locate the function."]
READ_LINES = ["", "Let me read the function.", "Reading the stubbed function.", "It starts at line {line}."]
READ_LIMITS = (20, 40, 60, 80, 120, 160, 240)
EDIT_LINES = ["", "Now I'll implement the body.", "I'll replace the stub with an implementation."]
TEST_LINES = ["", "Let me run the tests.", "Running the failing tests."]
FIX_LINES = ["The tests fail; let me fix the implementation.", "That is not right yet. Fixing it.",
             "Some tests still fail. Correcting the body."]
FIRST_TEST_LINES = ["Let me see which tests fail first.", "First, the failing tests.", ""]
CONTEXT_ABOVE = (2, 4, 8, 15)
FIX_LINE_LINES = ["", "Fixing the line.", "The token on that line is wrong; correcting it."]
FIXED_ANSWERS = ["Fixed line {line} of {path} (`{name}`); the tests pass.",
                 "Done: the bug on line {line} of {path} is fixed and the tests pass."]
ANSWERS = ["Implemented `{name}` in {path}; its tests pass.",
           "Done: `{name}` in {path} is implemented and the tests pass.",
           "I implemented `{name}` ({path}). The previously failing tests now pass."]


@dataclass
class Demonstration:
    task_id: str
    variant: str                 # "direct", or its flags joined: "recovery+tests_first", "no_explore", ...
    seed: int
    messages: list[dict]
    tools: list[dict]
    reward: float
    tool_calls: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def def_line(task: Task, stubbed: str) -> int:
    """1-based line of the function's `def` above the stubbed body (the read window's anchor)."""
    name = task.qualname.rsplit(".", 1)[-1]
    lines = stubbed.splitlines()
    for i in range(task.body_start_line - 1, -1, -1):
        if re.match(rf"\s*(async\s+)?def\s+{re.escape(name)}\b", lines[i]):
            return i + 1
    return max(1, task.body_start_line - 1)


def function_end(task: Task, stubbed: str) -> int:
    """1-based last line of the stubbed function (for a partial stub, the code after the hole too)."""
    try:
        fn = find_function(ast.parse(stubbed), task.qualname)
    except SyntaxError:
        fn = None
    return fn.end_lineno if fn is not None else task.body_start_line + task.stub_body.count("\n") - 1


def wrong_bodies(task: Task, original_file: str) -> list[str]:
    """Plausible wrong bodies that still compile: the reference with its last lines cut, or a
    lazy `return None`. Whether the tests really fail is checked by running them."""
    lines = task.original_body.splitlines(keepends=True)
    indent = re.match(r"\s*", lines[0]).group(0) if lines else "    "
    out = []
    for cut in (1, 2, 3):
        if len(lines) > cut:
            out.append("".join(lines[:-cut]))
    out.append(f"{indent}return None\n")
    head = original_file.splitlines(keepends=True)
    ok = []
    for body in out:
        text = ("".join(head[:task.body_start_line - 1]) + body + "".join(head[task.body_end_line:]))
        try:
            compile(text, task.module_path, "exec")
        except SyntaxError:
            continue
        if body.strip():
            ok.append(body)
    return ok


def unique_old_text(text: str, old: str, line: int) -> str:
    """`old` (the occurrence at or after 1-based `line`) widened upwards, line by line, until it
    occurs once in `text`: pi's edit needs a unique oldText, and a short wrong body such as
    `return None` often is not."""
    at = text.find(old, sum(len(x) for x in text.splitlines(keepends=True)[:line - 1]))
    if at < 0 or text.count(old) == 1:
        return old
    start = at
    while text.count(text[start:at + len(old)]) > 1 and start > 0:
        start = text.rfind("\n", 0, start - 1) + 1
    return text[start:at + len(old)]


def test_command(task: Task) -> str:
    """The folder holding the FAIL_TO_PASS tests, run whole: a command the model can write
    without knowing test ids (`-x` keeps a failing run's output short)."""
    folders = {str(Path(i.split("::", 1)[0]).parent) for i in task.fail_to_pass}
    folder = folders.pop() if len(folders) == 1 else "."
    argv = task.test_command   # its `-o pythonpath=src` (src layouts) is needed to import the library
    extra = [f"-o {argv[i + 1]}" for i, a in enumerate(argv[:-1]) if a == "-o"]
    return " ".join(["python -m pytest -x -q -p no:cacheprovider", *extra, folder])


def grep_line(observation: str, want: int) -> int | None:
    """The line number `grep -n` printed for the `def` at line `want`, or None if it did not."""
    seen = {int(m.group(1)) for m in re.finditer(r"^(\d+):", observation, re.M)}
    return want if want in seen else None


class _Episode:
    """Runs assistant tool calls on the env and records the conversation."""

    def __init__(self, env: CodingEnv, task: Task) -> None:
        self.env = env
        self.messages = [{"role": "system", "content": render_system_prompt(INSIDE_REPO)},
                         {"role": "user", "content": task.problem_statement}]
        self.calls = 0

    def call(self, text: str, name: str, args: dict) -> str:
        call_id = f"call_{self.calls}"
        self.calls += 1
        self.messages.append({"role": "assistant", "content": text, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        result = self.env.call_tool(name, args)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result.content})
        return result.content

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


def _one_token_fixes(task: Task, stubbed: str) -> list[str]:
    """Wrong fixes of a mutant line: the other one-token edits of that line that compile (the
    same operators that made the bug). Whether the tests really fail is checked by running them."""
    try:
        fn = find_function(ast.parse(stubbed), task.qualname)
    except SyntaxError:
        return []
    if fn is None:
        return []
    stmts = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    lines = stubbed.splitlines(keepends=True)
    out = []
    for n, _, text in function_mutations(fn, stmts, lines):
        text = text.rstrip("\n")
        if n == task.body_start_line and text.strip() != task.original_body.strip() and text not in out:
            out.append(text)
    return out


def _wrong_edits(task: Task, original: str, stubbed: str) -> list[str]:
    """Plausible wrong replacements of the stub (or mutant) lines, first the likeliest."""
    if task.level == "mutation":
        return _one_token_fixes(task, stubbed)
    return [b.rstrip("\n") for b in wrong_bodies(task, original)]


VARIANTS = ({}, {"recovery": True}, {"tests_first": True}, {"explore": False},
            {"tests_first": True, "recovery": True}, {"explore": False, "tests_first": True})


def variant_flags(k: int, recovery_fraction: float = 0.5) -> dict:
    """Demonstration k's shape: cycles through direct, recovery, tests-first, no exploration
    and their mixes (with recovery_fraction 0, no recovery)."""
    flags = dict(VARIANTS[k % len(VARIANTS)])
    if not recovery_fraction:
        flags.pop("recovery", None)
    return flags


def build_demonstration(task: Task, env_cfg, uid: int, seed: int, recovery: bool,
                        work_root: str | Path | None = None, tests_first: bool = False,
                        explore: bool = True) -> Demonstration | None:
    """One demonstration of `task`, or None when the variant cannot be built (grep does not
    show the function's `def`, the read window does not show the stub, or, for a recovery, no
    wrong edit fails the tests). The reward decides `reward`; callers keep 1.0.

    recovery: a wrong edit, its failing test output, then the fix. tests_first: the failing
    test run is read before anything else. explore=False: no grep; the read starts near the
    line the task statement names (levels whose statement names none always explore)."""
    rng = random.Random(f"{task.id}|{seed}|{recovery}|{tests_first}|{explore}")
    name = task.qualname.rsplit(".", 1)[-1]
    path = task.module_path
    mutation = task.level == "mutation"
    explore = explore or task.level == "body"      # a body task's statement names no line
    with CodingEnv(task, work_root or env_cfg.work_root, env_cfg, uid=uid) as env:
        original = (env.pristine / path).read_text()
        stubbed = (env.checkout / path).read_text()
        ep = _Episode(env, task)
        notes = []
        test_cmd = test_command(task)
        if tests_first:
            out = ep.call(rng.choice(FIRST_TEST_LINES), "bash", {"command": test_cmd})
            if not re.search(r"\b\d+ (failed|error)", out):
                return None
        end = function_end(task, stubbed)
        if explore:
            found = ep.call(rng.choice(OPENERS), "bash", {"command": f"grep -n 'def {name}(' {path}"})
            offset = grep_line(found, def_line(task, stubbed))
            if offset is None:     # the window must come from what the model saw
                return None
        else:                      # the statement's line number, a few lines of context above it
            offset = max(1, task.body_start_line - rng.choice(CONTEXT_ABOVE))
        span = end + 1 - offset
        limit = next((n for n in READ_LIMITS if n >= span + 2), span + 10)
        if mutation or not explore:
            limit = rng.choice([n for n in READ_LIMITS if n >= task.body_start_line - offset + 3] or [span + 10])
        seen = ep.call(rng.choice(READ_LINES).format(line=offset), "read",
                       {"path": path, "offset": offset, "limit": limit})
        stub = task.stub_body.rstrip("\n")
        # the stub's text without its indentation (the one constant `raise NotImplementedError`,
        # or the mutant line as the statement quotes it), widened upwards only if not unique
        core = stub.strip() if len(task.stub_body.splitlines()) == 1 else stub
        lead = stub[:len(stub) - len(core)] if stub.endswith(core) else ""
        old = unique_old_text(stubbed, core, task.body_start_line)
        if old not in seen:
            return None
        keep = old[:len(old) - len(core)]        # lines above the stub that made oldText unique
        fixed = task.original_body.rstrip("\n")
        fixed = fixed[len(lead):] if fixed.startswith(lead) else fixed
        edit_lines = FIX_LINE_LINES if mutation else EDIT_LINES
        if recovery:
            wrong = None
            for candidate in _wrong_edits(task, original, stubbed):
                candidate = candidate[len(lead):] if candidate.startswith(lead) else candidate
                ep_probe = ep.messages[:]                  # keep the conversation if this edit passes
                ep.call(rng.choice(edit_lines), "edit",
                        {"path": path, "edits": [{"oldText": old, "newText": keep + candidate}]})
                out = ep.call(rng.choice(TEST_LINES), "bash", {"command": test_cmd})
                if re.search(r"\b\d+ (failed|error)", out):
                    wrong = candidate
                    break
                ep.messages = ep_probe                      # that edit passed: undo it and try another
                undo = unique_old_text((env.checkout / path).read_text(), candidate, task.body_start_line)
                env.call_tool("edit", {"path": path, "edits": [
                    {"oldText": undo, "newText": undo[:len(undo) - len(candidate)] + core}]})
            if wrong is None:
                return None
            current = (env.checkout / path).read_text()
            fix_old = unique_old_text(current, wrong, task.body_start_line)
            fix_new = fix_old[:len(fix_old) - len(wrong)] + fixed
            ep.call(rng.choice(FIX_LINES), "edit", {"path": path, "edits": [{"oldText": fix_old, "newText": fix_new}]})
        else:
            ep.call(rng.choice(edit_lines), "edit",
                    {"path": path, "edits": [{"oldText": old, "newText": keep + fixed}]})
        out = ep.call(rng.choice(TEST_LINES), "bash", {"command": test_cmd})
        if not re.search(r"\b\d+ passed", out) or re.search(r"\b\d+ (failed|error)", out):
            notes.append(f"final test run did not pass: {out[-300:]}")
        answers = FIXED_ANSWERS if mutation else ANSWERS
        ep.answer(rng.choice(answers).format(name=name, path=path, line=task.body_start_line))
        reward = env.reward()
    calls = sum(1 for m in ep.messages if m["role"] == "tool")
    variant = "+".join(k for k, on in (("recovery", recovery), ("tests_first", tests_first),
                                       ("no_explore", not explore)) if on) or "direct"
    return Demonstration(task_id=task.id, variant=variant, seed=seed,
                         messages=ep.messages, tools=[dict(t) for t in PI_TOOLS], reward=reward.reward,
                         tool_calls=calls, notes=notes + ([reward.error] if reward.error else []))
