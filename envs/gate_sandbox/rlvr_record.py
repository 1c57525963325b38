"""pytest plugin (`-p rlvr_record`, at mining time, on the original code): record the arguments
the tests pass to the target functions, where they are plain data (rlvr_gate.encode).
An iterator argument is read (at most MAX_ITEMS items) and the function gets an equivalent
fresh one in its place: the items chained to what is left, so the call goes on as it would.

RLVR_RECORD (JSON) names the targets ({"key", "path", "qualname"}) and the descriptor the
record goes to at the end of the session. Each target's module is imported with one call put
before the function's first statement (its line kept), which hands the function's arguments
(its frame's parameters, after defaults) to `_called`; a call is encoded at once, before the
function can change its arguments. Per target: the distinct encoded calls (at most MAX_CALLS,
with the test each came from), how many calls were seen, and why the others were not plain.
"""
from __future__ import annotations

import ast
import importlib.machinery
import itertools
import json
import os
import sys

import pytest
import rlvr_gate

MAX_CALLS = 400
MAX_ITEMS = 200
_settings = json.loads(os.environ.pop("RLVR_RECORD", "{}"))
_targets: dict[str, dict] = {}     # key -> {"path", "qualname", "params", "calls", "seen", "unplain"}


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str) -> dict:
    """The parameter names as the frame holds them (private names of a method mangled)."""
    cls = qualname.split(".")[0].lstrip("_") if "." in qualname else ""

    def name(arg):
        n = arg.arg
        return f"_{cls}{n}" if cls and n.startswith("__") and not n.endswith("__") else n
    a = fn.args
    return {"pos": [name(x) for x in a.posonlyargs + a.args], "var": name(a.vararg) if a.vararg else None,
            "kw": [name(x) for x in a.kwonlyargs], "varkw": name(a.kwarg) if a.kwarg else None}


def _find(tree: ast.Module, qualname: str):
    body, node = tree.body, None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _taken(value):
    """(what the function gets instead, what is recorded): an iterator's items, if it has no more
    than MAX_ITEMS, as rlvr_gate.Items; the function gets them chained to the rest either way."""
    kind = type(value)
    if not hasattr(kind, "__next__") or kind.__module__ not in ("builtins", "itertools"):
        return value, value   # not an iterator, or one of its own kind (a file, a library's)
    items = list(itertools.islice(value, MAX_ITEMS + 1))
    if len(items) > MAX_ITEMS:
        return itertools.chain(items, value), value   # longer (or endless): not recorded
    return iter(items), rlvr_gate.Items(items)


def _called(key: str, frame_locals: dict) -> tuple:
    """One call of a target: its arguments as (positional, keyword), encoded now; returns the
    values of its parameters (an iterator replaced by an equivalent one, see the docstring)."""
    t = _targets[key]
    p = t["params"]
    names = p["pos"] + ([p["var"]] if p["var"] else []) + p["kw"] + ([p["varkw"]] if p["varkw"] else [])
    values = {n: frame_locals[n] for n in names}
    t["seen"] += 1
    if len(t["calls"]) >= MAX_CALLS:
        return tuple(values[n] for n in names)
    recorded = {}
    for n in names:
        if n == p["var"]:
            pairs = [_taken(v) for v in values[n]]
            values[n], recorded[n] = tuple(a for a, _ in pairs), [r for _, r in pairs]
        elif n == p["varkw"]:
            pairs = {k: _taken(v) for k, v in values[n].items()}
            values[n], recorded[n] = {k: a for k, (a, _) in pairs.items()}, {k: r for k, (_, r) in pairs.items()}
        else:
            values[n], recorded[n] = _taken(values[n])
    args = [recorded[n] for n in p["pos"]] + list(recorded[p["var"]] if p["var"] else ())
    kwargs = {n: recorded[n] for n in p["kw"]}
    if p["varkw"]:
        kwargs.update(recorded[p["varkw"]])
    try:
        data = json.dumps([rlvr_gate.encode(args), rlvr_gate.encode(kwargs)], sort_keys=True)
    except rlvr_gate.NotPlain as why:
        t["unplain"][str(why)] = t["unplain"].get(str(why), 0) + 1
    else:
        if data not in t["calls"]:
            t["calls"][data] = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    return tuple(values[n] for n in names)


class _Loader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):   # from the source: cached bytecode would skip the calls
        tree = ast.parse(self.get_data(self.path), self.path)
        for key, t in _targets.items():
            if t["path"] != self.path:
                continue
            fn = _find(tree, t["qualname"])
            if fn is None or not fn.body:
                continue
            t["params"] = _params(fn, t["qualname"])
            first = fn.body[0]
            at = int(isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                     and isinstance(first.value.value, str))   # after the docstring: it stays __doc__
            anchor = fn.body[min(at, len(fn.body) - 1)]
            p = t["params"]
            names = p["pos"] + ([p["var"]] if p["var"] else []) + p["kw"] + ([p["varkw"]] if p["varkw"] else [])
            record = f'__import__("rlvr_record")._called({key!r}, locals())'
            call = ast.parse(f"({', '.join(names)},) = {record}" if names else record).body[0]
            for n in ast.walk(call):
                n.lineno = n.end_lineno = anchor.lineno
                n.col_offset = n.end_col_offset = anchor.col_offset
            fn.body.insert(at, call)
        return compile(tree, self.path, "exec", dont_inherit=True)


class _Finder:
    @staticmethod
    def find_spec(name, path=None, target_module=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and any(t["path"] == spec.origin for t in _targets.values()):
            spec.loader = _Loader(name, spec.origin)
        return spec


def _install() -> None:
    for t in _settings.get("targets", []):
        _targets[t["key"]] = {"path": t["path"], "qualname": t["qualname"], "params": None, "calls": {},
                              "seen": 0, "unplain": {}}
    if _targets:
        sys.meta_path.insert(0, _Finder())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    fd = _settings.get("fd", -1)
    if fd < 0:
        return
    out = {key: {"calls": [[json.loads(c), test] for c, test in t["calls"].items()], "seen": t["seen"],
                 "unplain": t["unplain"], "instrumented": t["params"] is not None}
           for key, t in _targets.items()}
    view = memoryview(json.dumps(out).encode())
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)


_install()
