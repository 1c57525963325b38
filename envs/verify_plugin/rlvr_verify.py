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
  * checks that no plugin or hook implementation was registered after collection;
  * installs a PEP 578 audit hook at import, before the package under test is imported (it
    cannot be removed), that refuses, when the target function is what asks, what honest
    library code never does while tests run: garbage-collector walks, frame access, code
    objects, marshal/ctypes, compile/exec, tracing, reading test sources or bytecode. Each
    refusal raises in the code under test and is reported to the host (reward 0). What the
    reference function itself does (the host names it in RLVR_ALLOW, e.g. reading a
    function's `__code__` to find its argument names) is let through, unless the code reached
    is a test's; bytecode the import system reads to import a module is not the target's read;
  * signs every line with a nonce it removes from the environment at import; the nonce, the
    fd and the verifier live only in the audit hook's closure (no module global reaches
    them), and the hook signs only what the registered verifier itself sends;
  * reports only positively observed passes: a test that is never reported (plugin
    unregistered, os._exit, a hang) counts as failed.
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import sysconfig
import threading
import types

import pytest

_WATCHED_MODULES = ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.outcomes",
                    "_pytest.main", "_pytest.skipping", "_pytest.terminal", "_pytest.fixtures",
                    "_pytest.nodes", "_pytest.unittest", "_pytest.config", "pluggy._hooks",
                    "pluggy._callers", "pluggy._manager", "pytest")


_SEND, _CONFIGURE = "rlvr.send", "rlvr.configure"
_STDLIB = tuple({sysconfig.get_paths()["stdlib"] + "/", "<frozen "})
_FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code", "ag_code",
                "__code__"}
_ALWAYS = {"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "sys._current_frames",
           "sys._getframemodulename", "sys.settrace", "sys.setprofile", "marshal.load", "marshal.loads",
           "code.__new__", "compile", "exec"}
# stdlib functions that use frames or exec for their own bookkeeping and never hand them out
_HONEST = {("logging/__init__.py", "findCaller"), ("collections/__init__.py", "namedtuple"),
           ("typing.py", "_caller"), ("warnings.py", "warn"), ("warnings.py", "_next_external_frame"),
           ("gettext.py", "c2py")}   # c2py: a catalogue's checked plural-forms expression
_HONEST_MODULES = ("/dataclasses.py", "/enum.py", "/typing.py")
_IMPORTING = ("<frozen importlib",)


def _install() -> None:
    """Set up the audit hook and the verifier; both are reachable only from the hook's closure."""
    fd = int(os.environ.pop("RLVR_RESULT_FD", "-1"))
    nonce = os.environ.pop("RLVR_RESULT_NONCE", "")
    target, _, rng = os.environ.pop("RLVR_TARGET", "").partition(":")
    lo, _, hi = rng.partition(":")
    lo, hi = (int(lo), int(hi)) if lo else (0, -1)
    allowed = set(filter(None, os.environ.pop("RLVR_ALLOW", "").split(",")))
    test_dirs = ("/tests/", "/test/", "/testing/")
    plugin_dir = os.path.dirname(os.path.abspath(__file__))
    refused: list[str] = []
    state = threading.local()
    verifier = _Verifier()
    send_code = _Verifier._send.__code__

    def write(record: dict) -> None:
        if fd < 0:
            return
        record["nonce"] = nonce
        view = memoryview((json.dumps(record) + "\n").encode())
        while view:
            view = view[os.write(fd, view):]

    def test_file(path: str) -> bool:
        base = os.path.basename(path)
        return (any(d in path for d in test_dirs) or base.startswith("test_") or base.endswith("_test.py")
                or base == "conftest.py" or path.startswith(plugin_dir))

    def allowed_read(obj, attr: str) -> bool:
        """A code attribute the reference reads too, of code that is no test's: outside test files,
        or a function a test defines in its body (a lambda handed to the target), whose
        constants are the test's own arguments. A test's or helper's code stays refused."""
        code = getattr(obj, attr, None)
        if f"object.__getattr__ {attr}" not in allowed or not isinstance(code, types.CodeType):
            return False
        path = os.path.abspath(code.co_filename)
        return not test_file(path) or ("<locals>" in code.co_qualname and not path.startswith(plugin_dir))

    def asked_by_target(frame, honest: bool, importing: bool) -> bool:
        """Is the nearest frame outside the standard library the target function's?"""
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if name == target and lo <= code.co_firstlineno <= hi:
                return True
            if not name.startswith(_STDLIB):
                return False
            if importing and name.startswith(_IMPORTING):
                return False
            if honest and (name.endswith(_HONEST_MODULES) or any(
                    name.endswith("/" + f) and code.co_name == fn for f, fn in _HONEST) or (
                    name.endswith("/inspect.py") and ("signature" in code.co_name or code.co_name in
                                                      ("from_callable", "unwrap", "_has_code_flag")))):
                return False
            frame = frame.f_back
        return False

    def hook(event: str, args: tuple) -> None:
        if getattr(state, "busy", False):
            return
        imported_pyc = False   # an open of a library module's bytecode: the import system's read
        if event == _SEND:
            state.busy = True
            try:
                caller = sys._getframe(1)
                if caller.f_code is send_code and caller.f_locals.get("self") is verifier:
                    record = dict(args[0])
                    if record.get("finished"):
                        record["refused"] = list(refused)
                    write(record)
            finally:
                state.busy = False
            return
        if event == _CONFIGURE:
            if not getattr(hook, "configured", False):
                hook.configured = True
                verifier.pm = args[0].pluginmanager
                verifier.machinery = _snapshot()   # pytest's own set-up is done by now
                args[0].pluginmanager.register(verifier, "rlvr_verifier")
            return
        if event == "object.__getattr__":
            if args[1] not in _FRAME_ATTRS:
                return
        elif event == "object.__setattr__":
            if args[1] != "__code__":
                return
        elif event == "open":
            if isinstance(args[0], int) or (isinstance(args[0], str) and args[0].startswith("/")
                                             and not args[0].startswith(("/repo/", "/proc/", "/dev/"))):
                return
            path = os.path.realpath(os.fsdecode(args[0]))   # relative, /proc/self/cwd, symlinks
            if not path.startswith("/repo/"):
                return
            if not (test_file(path) or path.endswith(".pyc")):
                return
            imported_pyc = path.endswith(".pyc") and not test_file(_source_of(path))
        elif event in ("os.listdir", "os.scandir"):   # e.g. /proc/self/fd, to find the result pipe
            if not str(args[0]).startswith(("/proc", "/dev/fd")):
                return
        elif event == "import":
            if args[0].split(".")[0] not in ("ctypes", "_ctypes", "gc", "rlvr_verify"):
                return
        elif not (event in _ALWAYS or event.startswith("ctypes.")):
            return
        state.busy = True
        try:
            caller = sys._getframe(1)
            honest = event in ("sys._getframe", "compile", "exec", "object.__getattr__")
            importing = event in ("compile", "exec", "marshal.loads", "marshal.load") or imported_pyc
            if not asked_by_target(caller, honest, importing):
                return
            if event == "object.__getattr__" and allowed_read(args[0], args[1]):
                return
            what = f"{event} {args[1]}" if event.startswith("object.") else event
            if event in ("open", "import", "os.listdir", "os.scandir"):
                what += f" {str(args[0])[:200]}"
            refused.append(f"{what} from {os.path.basename(target)}")
        finally:
            state.busy = False
        raise RuntimeError(f"refused by the test harness: {what}")

    sys.addaudithook(hook)


def _source_of(pyc: str) -> str:
    """The source file a bytecode file caches (pkg/__pycache__/mod.cpython-311.pyc -> pkg/mod.py)."""
    folder, name = os.path.split(pyc)
    if os.path.basename(folder) == "__pycache__":
        return os.path.join(os.path.dirname(folder), name.split(".")[0] + ".py")
    return pyc[:-1]


def _snapshot(codes: bool = True) -> dict:
    """ids of pytest's machinery; with codes, also of their code objects (reading __code__ is
    an audited event, so the per-test checks leave it out: the hook sees code being set)."""
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
                    if not codes:
                        continue
                    code = getattr(member, "__code__", None) or getattr(getattr(member, "fget", None), "__code__", None)
                    if code is not None:
                        snap[(modname, name, attr, "code")] = id(code)
            code = getattr(value, "__code__", None) if codes else None
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
        self.pm = None
        self.hookimpls: set | None = None
        self.items: dict[str, tuple] = {}
        self.phases: dict[str, dict[str, str]] = {}
        self.tampered: list[str] = []

    def _send(self, record: dict) -> None:
        sys.audit(_SEND, record)   # the audit hook signs and writes it

    def _hooks(self) -> set:
        """Every registered plugin and hook implementation."""
        impls = {("plugin", name, id(plugin)) for name, plugin in self.pm.list_name_plugin()}
        for name, caller in vars(self.pm.hook).items():
            for impl in getattr(caller, "get_hookimpls", list)():
                impls.add((name, impl.plugin_name, id(impl.function)))
        return impls

    def _check(self, where: str) -> None:
        full = where in ("collection", "sessionfinish")
        now = _snapshot(codes=full)
        changed = [k for k, v in self.machinery.items() if (full or k[-1] != "code") and now.get(k) != v]
        if changed:
            self.tampered.append(f"{where}: pytest internals changed: {sorted(map(str, changed))[:5]}")
            self.machinery = now if full else {**self.machinery, **now}  # report each change once
        if self.hookimpls is not None and where == "sessionfinish":   # a full check costs ~1 ms
            hooks = self._hooks()
            if hooks != self.hookimpls:
                diff = sorted(str(h[:2]) for h in hooks ^ self.hookimpls)
                self.tampered.append(f"{where}: plugins or hook implementations changed: {diff[:5]}")
                self.hookimpls = hooks

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            self.items[item.nodeid] = _identity(item)
        self._check("collection")
        self.hookimpls = self._hooks()

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        linecache.clearcache()   # no test source is handed out from a cache filled by earlier reports
        yield

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
        self._send({"nodeid": item.nodeid, "outcome": outcome})

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self._send({"collect_error": report.nodeid or "<session>",
                   "message": str(report.longrepr)[-2000:]})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self._check("sessionfinish")
        self._send({"finished": True, "tampered": self.tampered})


def pytest_configure(config) -> None:
    sys.audit(_CONFIGURE, config)   # the hook registers its verifier (the first call only)


_install()
