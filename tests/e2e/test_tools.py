"""pi's tools on a real stubbed checkout: exact schemas, pi's semantics (offset/limit,
truncation, unique-match edits, bash timeout) and tolerant dispatch of malformed calls."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envs.tools import PI_TOOLS
from tests.fixtures.env import episode, toolz_tasks

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "pi-tools.json"  # beside the checkout


@pytest.fixture(scope="module")
def env():
    tasks = toolz_tasks()
    with episode(tasks[0]) as e:
        yield e


def test_schemas_are_pis_exactly(env):
    names = [t["function"]["name"] for t in env.tools()]
    assert names == ["read", "bash", "edit", "write"]
    if REFERENCE.exists():
        ref = {t["function"]["name"]: t for t in json.loads(REFERENCE.read_text())}
        for t in PI_TOOLS:
            assert t == ref[t["function"]["name"]]


def test_read_offset_limit_and_continuation(env):
    path = env.task.module_path
    full = (env.checkout / path).read_text().split("\n")
    res = env.call_tool("read", {"path": path, "offset": 3, "limit": 2})
    assert not res.is_error
    body, _, note = res.content.partition("\n\n[")
    assert body.split("\n") == full[2:4]
    assert "Use offset=5 to continue" in note
    whole = env.call_tool("read", json.dumps({"path": "/repo/" + path}))
    assert whole.content.split("\n") == full
    beyond = env.call_tool("read", {"path": path, "offset": 10**6})
    assert beyond.is_error and "beyond end of file" in beyond.content


def test_read_truncates_large_files(env):
    env.call_tool("write", {"path": "big.txt", "content": "\n".join(f"line {i}" for i in range(5000))})
    res = env.call_tool("read", {"path": "big.txt"})
    assert not res.is_error
    assert res.content.count("\n") < 2100 and "[Showing lines 1-2000 of 5000. Use offset=2001" in res.content


def test_edit_unique_match_rules(env):
    env.call_tool("write", {"path": "pkg_note.py", "content": "a = 1\nb = 1\nc = 2\n"})
    dup = env.call_tool("edit", {"path": "pkg_note.py", "edits": [{"oldText": "= 1", "newText": "= 3"}]})
    assert dup.is_error and "Found 2 occurrences" in dup.content
    missing = env.call_tool("edit", {"path": "pkg_note.py", "edits": [{"oldText": "zzz", "newText": "y"}]})
    assert missing.is_error and "Could not find" in missing.content
    overlap = env.call_tool("edit", {"path": "pkg_note.py", "edits": [
        {"oldText": "a = 1\nb", "newText": "x"}, {"oldText": "b = 1", "newText": "y"}]})
    assert overlap.is_error and "overlap" in overlap.content
    ok = env.call_tool("edit", {"path": "pkg_note.py", "edits": [
        {"oldText": "a = 1", "newText": "a = 10"}, {"oldText": "c = 2", "newText": "c = 20"}]})
    assert not ok.is_error and "Successfully replaced 2 block(s)" in ok.content
    assert (env.checkout / "pkg_note.py").read_text() == "a = 10\nb = 1\nc = 20\n"
    assert os.stat(env.checkout / "pkg_note.py").st_uid == env.uid   # the sandbox can keep editing it


def test_write_creates_parents_owned_by_sandbox(env):
    res = env.call_tool("write", {"path": "new/dir/f.txt", "content": "hi"})
    assert not res.is_error and res.content == "Successfully wrote 2 bytes to new/dir/f.txt"
    assert env.call_tool("bash", {"command": "echo more >> new/dir/f.txt && cat new/dir/f.txt"}).content == "himore\n"


def test_file_tools_stay_inside_the_checkout(env):
    assert env.call_tool("read", {"path": "/etc/passwd"}).is_error
    assert env.call_tool("read", {"path": "../../../../etc/hostname"}).is_error
    env.call_tool("bash", {"command": "ln -s /etc/hostname link && ln -s / rootlink"})
    res = env.call_tool("read", {"path": "link"})
    assert res.is_error and "outside the repository" in res.content
    assert env.call_tool("write", {"path": "rootlink/tmp/evil", "content": "x"}).is_error
    assert not os.path.exists("/tmp/evil")


def test_bash_exit_code_and_timeout(env):
    res = env.call_tool("bash", {"command": "echo out; echo err >&2; exit 3"})
    assert res.is_error and "out" in res.content and "err" in res.content
    assert "Command exited with code 3" in res.content
    slow = env.call_tool("bash", {"command": "sleep 30", "timeout": 1})
    assert slow.is_error and "Command timed out after 1 seconds" in slow.content
    assert env.call_tool("bash", {"command": "true"}).content == "(no output)"


def test_bash_command_that_stops_itself_is_an_error_that_says_so(env):
    res = env.call_tool("bash", {"command": "echo before; kill -STOP $$"})
    assert res.is_error and "before" in res.content and "timed out" not in res.content
    assert "bash stopped themselves (SIGSTOP or SIGTSTP)" in res.content, res.content


@pytest.mark.parametrize("name,args,expect", [
    ("read", {}, "missing required argument(s): path. It accepts: path (string, required), offset"),
    ("edit", {"path": "x.py"}, "missing required argument(s): edits"),
    ("bash", {"cmd": "ls"}, "missing required argument(s): command"),
    ("write", {"path": "a.txt"}, "missing required argument(s): content"),
    ("read", {"path": ["a"]}, "`path` of `read` must be a string"),
    ("read", {"path": "x", "offset": "ten"}, "`offset` of `read` must be a number"),
    ("edit", {"path": "x.py", "edits": [{"old": "a"}]}, "edits[0] must be an object with string fields"),
    ("bash", "{not json", "not valid JSON"),
    ("bash", "[1, 2]", "must be a JSON object"),
    ("grep", {"pattern": "x"}, "Unknown tool 'grep'. Available tools: read, bash, edit, write"),
    (None, {}, "Unknown tool None"),
])
def test_malformed_calls_get_instructive_errors(env, name, args, expect):
    res = env.call_tool(name, args)
    assert res.is_error and expect in res.content, res.content


def test_tolerant_dispatch_drops_spurious_arguments(env):
    path = env.task.module_path
    res = env.call_tool("read", {"path": path, "content": None, "command": "rm -rf /", "edits": [],
                                 "limit": "3"})
    assert not res.is_error and len(res.content.split("\n\n[")[0].split("\n")) == 3
    legacy = env.call_tool("write", {"path": "legacy.txt", "content": "one two"})
    assert not legacy.is_error
    single = env.call_tool("edit", {"path": "legacy.txt", "oldText": "one", "newText": "1"})
    assert not single.is_error and (env.checkout / "legacy.txt").read_text() == "1 two"
    as_string = env.call_tool("edit", {"path": "legacy.txt",
                                       "edits": json.dumps([{"oldText": "two", "newText": "2"}])})
    assert not as_string.is_error and (env.checkout / "legacy.txt").read_text() == "1 2"
    # the episode goes on after all of that
    assert env.call_tool("bash", {"command": "echo ok"}).content == "ok\n"
