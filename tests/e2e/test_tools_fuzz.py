"""`call_tool` never raises: the issue's malformed calls one by one, then hypothesis throwing
random JSON, sizes, NaN/inf, NUL bytes, surrogates, long paths, FIFOs and devices at every
tool of a real episode. Each answer must be a bounded, valid-UTF-8 message without host paths."""
from __future__ import annotations

import json
import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.env import WORK_ROOT, episode, toolz_tasks

UID = 63018
MAX_CHARS = 4000
BOUND = MAX_CHARS + 100          # the truncation note may follow the cap
CASES = {"n": 0, "longest": 0}


@pytest.fixture(scope="module")
def env():
    with episode(toolz_tasks()[0], sandbox_uid_base=UID, max_output_chars=MAX_CHARS,
                 command_timeout_s=2.0) as e:
        res = e.call_tool("bash", {"command": "mkfifo fifo && mkdir -p adir && ln -s /dev/zero zero "
                                              "&& ln -s /etc/passwd passwd && printf '\\377\\376x' > bad.txt"})
        assert not res.is_error, res.content
        try:
            os.mknod(e.checkout / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))   # a device node
        except PermissionError:   # no CAP_MKNOD (a user namespace, a rootless container)
            NO_DEVICE_NODE.append(True)
        (e.checkout / "huge.txt").write_bytes(b"x" * (17 * 1024 * 1024))          # past the file limit
        yield e


def check(env, name, args) -> None:
    res = env.call_tool(name, args)
    CASES["n"] += 1
    CASES["longest"] = max(CASES["longest"], len(res.content))
    assert isinstance(res.content, str) and isinstance(res.is_error, bool)
    assert len(res.content) <= BOUND, (name, len(res.content))
    res.content.encode("utf-8")   # must travel back to the model as JSON text
    for host in (str(env.dir), WORK_ROOT):
        assert host not in res.content, (name, res.content[:500])
    return res


ISSUE_CASES = [
    ("bash", '{"command": "echo hi", "timeout": NaN}', "finite number"),
    ("bash", {"command": "echo hi", "timeout": float("nan")}, "finite number"),
    ("bash", {"command": "echo hi", "timeout": float("inf")}, "finite number"),
    ("read", {"path": "a" * 300}, "255 bytes"),
    ("read", {"path": "a/" * 2_500_000}, "4096 bytes"),
    ("write", {"path": "b" * 5_000_000, "content": "x"}, "too long"),
    ("bash", {"command": "echo a\0b"}, "NUL byte"),
    ("read", {"path": "a\0b"}, "NUL byte"),
    ("write", {"path": "s.txt", "content": "x\ud800y"}, "lone surrogate"),
    ("edit", {"path": "s.txt", "edits": [{"oldText": "x", "newText": "\udfff"}]}, "lone surrogate"),
    ("read", {"path": "fifo"}, "It is a FIFO"),
    ("write", {"path": "fifo", "content": "x"}, "not a regular file"),
    ("edit", {"path": "fifo", "edits": [{"oldText": "a", "newText": "b"}]}, "It is a FIFO"),
    ("read", {"path": "null"}, "read"),
    ("read", {"path": "adir"}, "directory"),
    ("read", {"path": "zero"}, "outside the repository"),
    ("read", {"path": "huge.txt"}, "file size limit"),
    ("write", {"path": "setup.cfg/x", "content": "q"}, "is a file"),
    ("bash", {"command": "head -c 100M /dev/zero > big"}, "SIGXFSZ: a file reached the 16 MiB file size limit"),
    ("bash", "[" * 100_000, "nested too deeply"),
    ("bash", {"command": "sleep 5", "timeout": 0.5}, "(the time limit)"),
    ("bash", {"command": "true", "timeout": 0}, "must be a positive number of seconds, got 0"),
    ("bash", {"command": "true", "timeout": -3}, "must be a positive number of seconds, got -3"),
]


NO_DEVICE_NODE: list[bool] = []


@pytest.mark.parametrize("name,args,expect", ISSUE_CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(ISSUE_CASES)])
def test_malformed_call_gets_a_clear_error(env, name, args, expect):
    if NO_DEVICE_NODE and args == {"path": "null"}:
        pytest.skip("this host cannot make a device node (no CAP_MKNOD)")
    res = check(env, name, args)
    assert res.is_error and expect in res.content, res.content[:500]


def test_long_command_goes_through_a_file_not_argv(env):
    res = check(env, "bash", {"command": "echo " + "x" * 5_000_000 + " | wc -c"})
    assert not res.is_error and res.content.strip() == "5000001", res.content[:300]


# --- random input -----------------------------------------------------------------------------
SPECIAL = ["\0", "\ud800", "\udfff", "\x7f", "\n", "\r\n", "\ufeff", "..", "/", "NaN", "'", "\"", "$(", "*"]
texts = st.lists(st.one_of(st.text(max_size=20), st.sampled_from(SPECIAL)), max_size=8).map("".join)
longs = st.tuples(st.sampled_from(["a", "a/", "é", "../", "\0"]), st.integers(0, 3_000_000)).map(lambda t: t[0] * t[1])
paths = st.one_of(st.sampled_from(["fifo", "null", "adir", "zero", "passwd", "bad.txt", "huge.txt", "/repo/README.rst",
                                   "/etc/passwd", "../../etc", "/repo/../x", "@adir", "", " ", "new/dir/f.py"]),
                  texts, longs)
numbers = st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["3", "2.5", "1e999", "nan", "-1", "0x10"]), st.booleans(), st.none())
json_values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, texts),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(texts, inner, max_size=4)), max_leaves=12)
edits = st.one_of(json_values, st.lists(st.fixed_dictionaries({"oldText": st.one_of(texts, longs),
                                                               "newText": st.one_of(texts, longs)}), max_size=3))
commands = st.one_of(texts, st.sampled_from(["ls -la", "cat fifo & sleep 0.1", "cat /dev/zero | head -c 9", "exit 7",
                                             "kill -SEGV $$", "ulimit -a", "yes | head -n 99999", "echo $'\\xff'"]))
ARGS = {
    "read": st.fixed_dictionaries({"path": paths}, optional={"offset": numbers, "limit": numbers}),
    "write": st.fixed_dictionaries({"path": paths, "content": st.one_of(texts, longs, json_values)}),
    "edit": st.fixed_dictionaries({"path": st.one_of(paths, st.just("bad.txt"))}, optional={"edits": edits}),
    "bash": st.fixed_dictionaries({"command": commands}, optional={"timeout": numbers}),
}
calls = st.one_of(
    st.tuples(st.sampled_from(list(ARGS)), st.one_of(*ARGS.values())),                  # schema-ish, any tool
    st.sampled_from(list(ARGS)).flatmap(lambda n: st.tuples(st.just(n), ARGS[n])),        # schema-shaped
    st.tuples(st.one_of(st.sampled_from(list(ARGS)), texts, st.none(), st.integers()),
              st.one_of(json_values, json_values.map(lambda v: json.dumps(v, ensure_ascii=False)), texts)),
)


@settings(max_examples=int(os.environ.get("RLVR_FUZZ_EXAMPLES", "400")), deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(call=calls)
def test_call_tool_never_raises(env, call):
    check(env, *call)


def test_report_fuzz_counts():
    print(f"\ncall_tool cases: {CASES['n']}, longest message: {CASES['longest']} characters (bound {BOUND})")
    assert CASES["longest"] <= BOUND
