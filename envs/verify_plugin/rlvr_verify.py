"""pytest plugin (loaded with `-p rlvr_verify` from outside the checkout) that reports each
test's outcome to the host over an inherited pipe, independently of pytest's own reports.

Why: the code under test runs inside the pytest process, so it can patch pytest's report
classes, hooks or exit status (a wrong implementation that patched the report class scored
1.0 in a probe). This plugin
  * reads the raw exception of every phase from `call.excinfo` in a first-run hook wrapper,
    before any report object exists, so patched report classes change nothing here;
  * snapshots pytest's runner/report/outcome machinery and every collected test function's
    code before tests run and re-checks it after each test: any change marks the run as
    tampered (the host then gives 0);
  * signs every line with a nonce it removes from the environment at import, before the
    package under test is imported, and reports only positively observed passes: a test
    that is never reported (plugin unregistered, os._exit, a hang) counts as failed.
Code written specifically to find this plugin in memory could still forge lines; this is a
guard against generic pytest tampering, not a proof.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

_FD = int(os.environ.pop("RLVR_RESULT_FD", "-1"))
_NONCE = os.environ.pop("RLVR_RESULT_NONCE", "")
_WATCHED_MODULES = ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.outcomes",
                    "_pytest.main", "_pytest.skipping", "_pytest.terminal", "_pytest.fixtures",
                    "_pytest.nodes", "_pytest.unittest", "_pytest.config", "pluggy._hooks",
                    "pluggy._callers", "pluggy._manager", "pytest")


def _send(record: dict) -> None:
    if _FD < 0:
        return
    record["nonce"] = _NONCE
    data = (json.dumps(record) + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(_FD, view)
        view = view[n:]


def _snapshot() -> dict:
    snap = {}
    for modname in _WATCHED_MODULES:
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        for name, value in list(vars(mod).items()):
            snap[(modname, name)] = id(value)
            if isinstance(value, type) and value.__module__ == modname:
                for attr, member in list(vars(value).items()):
                    snap[(modname, name, attr)] = id(member)
                    code = getattr(member, "__code__", None) or getattr(getattr(member, "fget", None), "__code__", None)
                    if code is not None:
                        snap[(modname, name, attr, "code")] = id(code)
            code = getattr(value, "__code__", None)
            if code is not None:
                snap[(modname, name, "code")] = id(code)
    return snap


def _status(excinfo) -> str:
    if excinfo is None:
        return "ok"
    if excinfo.errisinstance(pytest.skip.Exception):
        return "skipped"
    return "failed"


def _identity(item) -> tuple[int, int]:
    """The test's function and its code (unwrapping bound methods, which are new each access)."""
    obj = getattr(item, "obj", None)
    fn = getattr(obj, "__func__", obj)
    return id(fn), id(getattr(fn, "__code__", None))


class _Verifier:
    def __init__(self) -> None:
        import _pytest.python  # noqa: F401
        import _pytest.reports  # noqa: F401
        import _pytest.runner  # noqa: F401  (make sure the machinery is loaded before the snapshot)
        import _pytest.unittest  # noqa: F401
        self.machinery = _snapshot()
        self.items: dict[str, tuple] = {}
        self.phases: dict[str, dict[str, str]] = {}
        self.tampered: list[str] = []

    def _check(self, where: str) -> None:
        now = _snapshot()
        changed = [k for k, v in self.machinery.items() if now.get(k) != v]
        if changed:
            self.tampered.append(f"{where}: pytest internals changed: {sorted(map(str, changed))[:5]}")
            self.machinery = now  # report each change once

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            self.items[item.nodeid] = _identity(item)
        self._check("collection")

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        before = _status(call.excinfo)
        yield
        # unittest items attach their exception to `call` inside pytest's own makereport hook,
        # so look again afterwards; either look seeing a failure makes the phase fail
        after = _status(call.excinfo)
        status = "failed" if "failed" in (before, after) else "skipped" if "skipped" in (before, after) else "ok"
        self.phases.setdefault(item.nodeid, {})[call.when] = status
        if call.when == "teardown":
            self._finish(item)

    def pytest_runtest_logreport(self, report) -> None:
        # reports can only downgrade an outcome (e.g. a failed subtest), never upgrade one
        if report.failed:
            self.phases.setdefault(report.nodeid, {})["report"] = "failed"

    def _finish(self, item) -> None:
        if self.items.get(item.nodeid) != _identity(item):
            self.tampered.append(f"{item.nodeid}: test function replaced")
        self._check(item.nodeid)
        ph = self.phases.get(item.nodeid, {})
        if any(v == "failed" for v in ph.values()):
            outcome = "failed"
        elif "skipped" in ph.values():
            outcome = "skipped"
        elif ph.get("setup") == "ok" and ph.get("call") == "ok" and ph.get("teardown") == "ok":
            outcome = "passed"
        else:
            outcome = "failed"
        if outcome == "passed" and item.get_closest_marker("xfail") is not None:
            outcome = "xpassed"  # not a plain pass: excluded from PASS_TO_PASS when mining
        _send({"nodeid": item.nodeid, "outcome": outcome})

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            _send({"collect_error": report.nodeid or "<session>",
                   "message": str(report.longrepr)[-2000:]})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self._check("sessionfinish")
        _send({"finished": True, "tampered": self.tampered})


def pytest_configure(config) -> None:
    config.pluginmanager.register(_Verifier(), "rlvr_verifier")
