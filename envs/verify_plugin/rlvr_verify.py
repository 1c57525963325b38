"""pytest plugin (loaded with `-p rlvr_verify` from outside the checkout) that decides each
test's outcome in a process the code under test never runs in, and reports it to the host.

Threat model. The code under test (the agent's target function) runs inside a test, so it
can do whatever Python code in that process can: patch pytest, register hooks, walk memory,
write to any file descriptor. What this plugin makes sure of:
  * The reporter -- the pytest process that collects the tests -- holds the only handle to
    the host's result pipe and never runs a test. Tests run in runner processes forked from
    it, which close that handle before anything else; the reporter is non-dumpable, so a
    runner can neither reopen the pipe through /proc nor ptrace the reporter. There is no
    secret to steal: the pipe itself is the capability, and no runner holds it.
  * The target's module is imported with one audit call put before the target's first
    statement: the moment the target runs in a runner, the reporter hears it, before a line of
    the target's own code runs. That test is the runner's last; the next test gets a fresh
    fork of the clean reporter. So nothing the target changes (pytest's internals, hooks,
    plugins, the test module, a hook that unregisters itself) reaches another test, and tests
    that never run the target share a runner (one fork for most of a suite).
  * A test passes only if its lines say so: the runner wraps the test's call and writes the
    raw outcome (the exception the test raised, before any pytest hook or report sees it) at
    once. The target shares the runner's process, and reaches its module through
    `sys.modules` (no audit event covers that, or a closure cell's write), so what decides
    holds no state it could rewrite: the line texts are constants of the writing code (no
    table), every value the writer, the guarded call, the exit and thread guards and the audit
    hook decide with is a default argument or a local of a frame the target cannot reach,
    bound before any test ran, and the tables are frozen. The reporter holds the lines to the
    runner's: each phase once and in order, report lines only for failures, nothing the runner
    does not write (else the run is tampered); the worst line for a phase wins and a missing
    one is a failure. A test the target ran in must end its runner through the runner's own
    exit with status 0 (os._exit is refused to the target), after the runner's check of its
    process (the test, pytest's modules, this module and its classes, the reporter's
    attributes, builtins and os: any name rebound is tampering) and its `checked` line; a
    runner killed, stopped or past its deadline fails its test. Forged lines cannot raise an
    outcome, and a different file on the pipe's descriptor is noticed.
  * If the target runs in the reporter (while tests are collected, or from a conftest hook)
    the run is tampered; after collection the tested name must resolve to the edited code.
  * In a runner an audit hook (PEP 578, installed before the package is imported) refuses the
    target -- its code anywhere on the current stack, through pytest's helpers and the tests'
    callbacks too -- frame and garbage-collector access, code objects, marshal/ctypes,
    compile/exec, tracing, processes, signals and reading test sources; the threads it
    starts are refused (3.11 has no audit event for them).
What remains possible: a target that makes its own test pass by means no audit event covers
-- a return value whose comparison lies, a mutable object the runner's code reads through a
default argument changed in place, a body fitted to the tests' inputs -- is left to the static
screen (envs/screen.py), which refuses the constructs by what they resolve to, not by how they
are spelled, and, for tasks with recorded inputs, to the differential gate (envs/gate.py),
which runs the candidate and the original in other processes and compares their results as
data: nothing this process holds can reach that verdict. A lie here still reaches only the
tests the target runs in.
"""
from __future__ import annotations

import json
import linecache
import os
import select
import signal
import sys
import sysconfig
import threading
import time
import types

import pytest
from _pytest.outcomes import Skipped

_WATCHED_MODULES = ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.outcomes",
                    "_pytest.main", "_pytest.skipping", "_pytest.terminal", "_pytest.fixtures",
                    "_pytest.nodes", "_pytest.unittest", "_pytest.config", "_pytest._code.code", "pluggy._hooks",
                    "pluggy._callers", "pluggy._manager", "pytest",
                    __name__, "builtins", "os", "posixpath")   # the verifier's own module and what it calls
_STDLIB = tuple({sysconfig.get_paths()["stdlib"] + "/", "<frozen "})
_PYTEST_PARTS = ("/_pytest/", "/pytest/", "/pluggy/")   # pytest's own code: the target reaching through it is the target
# every table below is immutable, and the functions that decide read them through values bound
# when they were defined (default arguments), never through this module's names: rebinding one
# of those (from the target, through sys.modules) changes nothing and is seen (the snapshot)
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code", "ag_code",
                          "__code__"})
_ALWAYS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "sys._current_frames",
           "sys._getframemodulename", "sys.settrace", "sys.setprofile", "marshal.load", "marshal.loads",
           "code.__new__", "compile", "exec", "sys.addaudithook", "os.fork", "os.forkpty", "os.posix_spawn",
           "os.spawn", "os.system", "os.exec", "os.kill", "os.killpg", "subprocess.Popen", "signal.pthread_kill",
           "resource.setrlimit", "resource.prlimit", "os.putenv", "os.unsetenv"})
# stdlib functions that use frames or exec for their own bookkeeping and never hand them out
_HONEST = frozenset({("logging/__init__.py", "findCaller"), ("collections/__init__.py", "namedtuple"),
                    ("typing.py", "_caller"), ("warnings.py", "warn"), ("warnings.py", "_next_external_frame"),
                    ("gettext.py", "c2py")})   # c2py: a catalogue's checked plural-forms expression
_HONEST_MODULES = ("/dataclasses.py", "/enum.py", "/typing.py", "/platform.py")   # platform runs `uname -p`
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec"})
_IMPORTING = ("<frozen importlib",)
_TEST_DIRS = ("/tests/", "/test/", "/testing/")
_PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))
_MAX_TEST_BYTES = 1 << 20
_exit_now = os._exit   # the real one: the runner's own exit (os._exit is guarded once installed)
_ENTERED = "rlvr.target"   # the audit event the target's instrumented first statement raises
_ENTER_CALL = f'__import__("sys").audit("{_ENTERED}")'


def _test_file(path: str, _dirs=_TEST_DIRS, _plugin=_PLUGIN_DIR, _basename=os.path.basename, any=any) -> bool:
    base = _basename(path)
    return (any(d in path for d in _dirs) or base.startswith("test_") or base.endswith("_test.py")
            or base == "conftest.py" or path.startswith(_plugin))


def _source_of(pyc: str, _split=os.path.split, _basename=os.path.basename, _dirname=os.path.dirname,
               _join=os.path.join) -> str:
    """The source file a bytecode file caches (pkg/__pycache__/mod.cpython-311.pyc -> pkg/mod.py)."""
    folder, name = _split(pyc)
    if _basename(folder) == "__pycache__":
        return _join(_dirname(folder), name.split(".")[0] + ".py")
    return pyc[:-1]


def _target_test(target: str, lo: int, hi: int):
    """is_target(code): the code is the target function's. Its values are default arguments (no
    closure cell anyone could rewrite): a copy for each guard that needs one."""
    def is_target(code, _target=target, _lo=lo, _hi=hi) -> bool:
        return code.co_filename == _target and _lo <= code.co_firstlineno <= _hi
    return is_target


def _install() -> None:
    """Read the host's settings, set up the audit hook and the reporter (module state holds neither)."""
    env = os.environ
    host_fd = int(env.pop("RLVR_RESULT_FD", "-1"))
    target, _, rest = env.pop("RLVR_TARGET", "").partition(":")
    lo, _, rest = rest.partition(":")
    hi, _, qualname = rest.partition(":")
    lo, hi = (int(lo), int(hi)) if lo else (0, -1)
    allowed = frozenset(filter(None, env.pop("RLVR_ALLOW", "").split(",")))
    deadline_s = float(env.pop("RLVR_TEST_DEADLINE", "30"))
    refused: list[str] = []
    child = {"fd": -1, "pipe": None, "tainted": False, "pid": -1}   # a runner: its pipe and pid (set by arm())
    ran_here: list[str] = []   # the reporter: the target's code ran in it

    # what these closures share only reports (refusals, the taint); what decides is the hook's own
    def arm(fd: int) -> None:
        if child["fd"] < 0:
            info = os.fstat(fd)
            child["fd"], child["pipe"], child["pid"] = fd, (info.st_dev, info.st_ino), os.getpid()

    def refuse(what: str) -> None:
        """Record a refusal; in a runner the reporter hears it at once."""
        refused.append(f"{what} from {os.path.basename(target)}")
        if child["fd"] >= 0:
            _raw_line(child["fd"], child["pipe"], ("refused " + refused[-1].replace("\n", " ")[:300] + "\n").encode())

    def tainted() -> bool:
        return child["tainted"]

    def entered() -> None:
        """The target's first statement ran (the instrumented call): in a runner, the reporter
        hears it before any of the target's own code runs; in the reporter it is tampering."""
        if child["fd"] < 0:
            if not ran_here:
                ran_here.append(f"{qualname or 'the target'} ran while the tests were collected")
        elif not child["tainted"] and os.getpid() == child["pid"]:   # not a worker a test forked
            child["tainted"] = True
            _raw_line(child["fd"], child["pipe"], b"tainted\n")

    sys.addaudithook(_make_hook(target, lo, hi, allowed, entered, refuse))
    import posix
    os._exit = posix._exit = _guarded_exit(_exit_now, _target_test(target, lo, hi), refuse)
    if target and qualname:
        _instrument(target, qualname)
    _make_undumpable()
    _guard_threads(target, lo, hi, refuse)
    _Reporter.settings = (host_fd, _target_test(target, lo, hi), target, qualname, deadline_s, refused, arm,
                          tainted, ran_here, refuse)


def _make_hook(target: str, lo: int, hi: int, allowed: frozenset, entered, refuse,
               _getframe=sys._getframe, realpath=os.path.realpath, fsdecode=os.fsdecode, abspath=os.path.abspath,
               test_file=_test_file, source_of=_source_of, local=threading.local, CodeType=types.CodeType,
               frame_attrs=_FRAME_ATTRS, always=_ALWAYS, honest_fns=_HONEST, honest_modules=_HONEST_MODULES,
               process_events=_PROCESS_EVENTS, stdlib=_STDLIB, pytest_parts=_PYTEST_PARTS, importing_from=_IMPORTING,
               plugin_dir=_PLUGIN_DIR, entered_event=_ENTERED, isinstance=isinstance, getattr=getattr, str=str,
               any=any, RuntimeError=RuntimeError):
    """The audit hook. Everything it decides with is a local of this call (its parameters: the
    builtins, the os and sys functions and the tables as they were at install), held only by the
    hook, which nothing in Python can reach once it is installed: rebinding a module name, a
    builtin or a function's closure cell from the target does not change what it refuses."""
    state = local()

    def is_target(code) -> bool:
        return code.co_filename == target and lo <= code.co_firstlineno <= hi

    def allowed_read(obj, attr: str) -> bool:
        """A code attribute the reference reads too, of code that is no test's: outside test files,
        or a function a test defines in its body (a lambda handed to the target), whose
        constants are the test's own arguments. A test's or helper's code stays refused."""
        code = getattr(obj, attr, None)
        if f"object.__getattr__ {attr}" not in allowed or not isinstance(code, CodeType):
            return False
        path = abspath(code.co_filename)
        return not test_file(path) or ("<locals>" in code.co_qualname and not path.startswith(plugin_dir))

    def asked_by_target(frame, honest: bool, importing: bool) -> bool:
        """Is the target's code on the stack above this event, with only the standard library,
        pytest and the tests' own callbacks in between? The library's own code in between
        answers for itself (its honest introspection is not the target's); so do the stdlib's
        honest bookkeeping functions and the import system."""
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if is_target(code):
                return True
            if name.startswith(plugin_dir):
                return False   # the harness's own guards (threads, os._exit) ask for themselves
            if name.startswith(stdlib):
                if importing and name.startswith(importing_from):
                    return False
                if honest and (name.endswith(honest_modules) or any(
                        name.endswith("/" + f) and code.co_name == fn for f, fn in honest_fns) or (
                        name.endswith("/inspect.py") and ("signature" in code.co_name or code.co_name in
                                                          ("from_callable", "unwrap", "_has_code_flag")))):
                    return False
            elif not (any(p in name for p in pytest_parts) or test_file(name)):
                return False   # the library under test (or another installed one) asked
            frame = frame.f_back
        return False

    def hook(event: str, args: tuple) -> None:
        if event == entered_event:
            entered()
            return
        if getattr(state, "busy", False):
            return
        imported_pyc = False   # an open of a library module's bytecode: the import system's read
        if event == "object.__getattr__":
            if args[1] not in frame_attrs:
                return
        elif event in ("object.__setattr__", "object.__delattr__"):
            if args[1] not in ("__code__", "__defaults__", "__kwdefaults__"):
                return
        elif event == "open":
            if isinstance(args[0], int) or (isinstance(args[0], str) and args[0].startswith("/")
                                             and not args[0].startswith(("/repo/", "/proc/", "/dev/"))):
                return
            path = realpath(fsdecode(args[0]))   # relative, /proc/self/cwd, symlinks
            if not path.startswith("/repo/"):
                return
            if not (test_file(path) or path.endswith(".pyc")):
                return
            imported_pyc = path.endswith(".pyc") and not test_file(source_of(path))
        elif event in ("os.listdir", "os.scandir"):   # e.g. /proc/self/fd
            if not str(args[0]).startswith(("/proc", "/dev/fd")):
                return
        elif event == "import":
            if args[0].split(".")[0] not in ("ctypes", "_ctypes", "gc", "rlvr_verify", "posix", "_posixsubprocess"):
                return
        elif not (event in always or event.startswith("ctypes.")):
            return
        state.busy = True
        try:
            caller = _getframe(1)
            honest = event in ("sys._getframe", "compile", "exec", "object.__getattr__") or event in process_events
            importing = event in ("compile", "exec", "marshal.loads", "marshal.load") or imported_pyc
            if not asked_by_target(caller, honest, importing):
                return
            if event == "object.__getattr__" and allowed_read(args[0], args[1]):
                return
            what = f"{event} {args[1]}" if event.startswith("object.") else event
            if event in ("open", "import", "os.listdir", "os.scandir"):
                what += f" {str(args[0])[:200]}"
            refuse(what)
        finally:
            state.busy = False
        raise RuntimeError(f"refused by the test harness: {what}")

    return hook


def _raw_line(fd: int, pipe: tuple, data: bytes, _write=os.write, _fstat=os.fstat) -> None:
    """Write one line to a test's pipe, refusing a descriptor that is no longer that pipe
    (the defaults bind the builtins: rebinding os.write changes nothing here)."""
    info = _fstat(fd)
    if (info.st_dev, info.st_ino) != pipe:
        raise RuntimeError("the runner's pipe was replaced")
    view = memoryview(data)
    while view:
        view = view[_write(fd, view):]


def _instrument(target: str, qualname: str) -> None:
    """Import the target's module with one call put before the target's first statement (after
    its docstring), on that statement's line: the target cannot run a line of its own before
    the reporter knows its process ran it. Line numbers and the rest of the module are kept."""
    import ast
    import importlib.machinery

    class Loader(importlib.machinery.SourceFileLoader):
        def get_code(self, fullname):   # always from the source: no cached bytecode skips the call
            tree = ast.parse(self.get_data(self.path), self.path)
            node, body = None, tree.body
            for part in qualname.split("."):
                node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                             and n.name == part), None)
                if node is None:
                    break
                body = node.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                at = int(isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                         and isinstance(first.value.value, str))
                anchor = node.body[min(at, len(node.body) - 1)]
                call = ast.parse(_ENTER_CALL).body[0]
                for n in ast.walk(call):
                    n.lineno, n.end_lineno = anchor.lineno, anchor.lineno
                    n.col_offset, n.end_col_offset = anchor.col_offset, anchor.col_offset
                node.body.insert(at, call)
            return compile(tree, self.path, "exec", dont_inherit=True)

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target_module=None):
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.origin == target:
                spec.loader = Loader(name, spec.origin)
            return spec

    sys.meta_path.insert(0, Finder())


def _make_undumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same uid (the tests') may not open this process's
    /proc/<pid>/fd or ptrace it. Loaded before the hook refuses ctypes to anyone but the target."""
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        raise RuntimeError("rlvr_verify: prctl(PR_SET_DUMPABLE, 0) failed; the result pipe would be reachable")


def _guard_threads(target: str, lo: int, hi: int, refuse) -> None:
    """Threads the target starts in a runner are refused (3.11 raises no audit event for them, and
    a thread's stack does not hold the frame that started it). Armed in every process but the
    reporter (a runner is a fork: another pid); its values are default arguments, so the guard
    reached as `_thread.start_new_thread` has no state to rewrite."""
    import _thread

    def guarded(function, args, kwargs=None, _start=_thread.start_new_thread, _reporter=os.getpid(),
                _getpid=os.getpid, _getframe=sys._getframe, _is_target=_target_test(target, lo, hi),
                _refuse=refuse, RuntimeError=RuntimeError):
        if _getpid() != _reporter:
            frame = _getframe(1)
            while frame is not None:
                if _is_target(frame.f_code):
                    _refuse("a thread start")
                    raise RuntimeError("refused by the test harness: a thread started by the target")
                frame = frame.f_back
        return _start(function, args) if kwargs is None else _start(function, args, kwargs)

    _thread.start_new_thread = _thread.start_new = guarded
    threading._start_new_thread = guarded


def _snapshot() -> tuple:
    """pytest's machinery as (namespace, name, object) triples: module attributes and class
    members. A fork keeps the objects, so a test's process must still show the very same ones."""
    snap = []
    for modname in _WATCHED_MODULES:
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        space = vars(mod)
        stdlib = modname in ("builtins", "os", "posixpath")   # their data includes lazy caches (posixpath._varprog)
        for name, value in list(space.items()):
            if stdlib and not callable(value):
                continue
            snap.append((space, name, value))
            if isinstance(value, type) and value.__module__ == modname and modname != "builtins":
                members = vars(value)
                snap += [(members, attr, member) for attr, member in list(members.items())]
    return tuple(snap)


def _instance_snapshot(obj) -> tuple:
    """An object's own attributes as snapshot triples (the reporter, once its runner set it up)."""
    space = vars(obj)
    return tuple((space, name, value) for name, value in list(space.items()))


def _changed(snap: tuple, _missing=object(), isinstance=isinstance) -> list[str]:
    """The names of a snapshot that no longer hold the same object."""
    out = []
    for space, name, value in snap:
        if space.get(name, _missing) is not value:
            where = space.get("__name__") or space.get("__qualname__") or "the reporter"
            out.append(f"{where if isinstance(where, str) else '?'}.{name}")
    return out


def _hooks(pm) -> set:
    """Every registered plugin and hook implementation."""
    impls = {("plugin", name, id(plugin)) for name, plugin in pm.list_name_plugin()}
    for name, caller in vars(pm.hook).items():
        for impl in getattr(caller, "get_hookimpls", list)():
            impls.add((name, impl.plugin_name, id(impl.function)))
    return impls


def _identity(item) -> tuple[int, int]:
    """The test's function and its code (unwrapping bound methods, which are new each access)."""
    obj = getattr(item, "obj", None)
    fn = getattr(obj, "__func__", obj)
    return id(fn), id(getattr(fn, "__code__", None))


def _codes_of(obj, depth: int = 0, seen: set | None = None) -> list:
    """The code objects a tested name leads to through wrappers (functools.wraps, toolz.curry,
    funcy's decorators, methods, properties, closures over the wrapped function)."""
    seen = set() if seen is None else seen
    if depth > 6 or obj is None or id(obj) in seen:
        return []
    seen.add(id(obj))
    found = []
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        found.append(code)
    for attr in ("__wrapped__", "__func__", "func", "fget"):
        inner = getattr(obj, attr, None)
        if inner is not None and inner is not obj:
            found += _codes_of(inner, depth + 1, seen)
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:   # an empty cell
            continue
        if callable(inner):
            found += _codes_of(inner, depth + 1, seen)
    return found


def _status(excinfo, _skipped=Skipped) -> str:
    if excinfo is None:
        return "ok"
    if excinfo.errisinstance(_skipped):
        return "skipped"
    return "failed"


class _Runner:
    """The reporter's handle on one runner process: its pipe, its lines, whether the target ran."""

    def __init__(self, pid: int, fd: int, first: int) -> None:
        self.pid, self.fd, self.next = pid, fd, first
        self.buffer = b""
        self.lines: list[str] = []
        self.open = True
        self.status: int | None = None
        self.tainted = False

    def _pump(self, deadline: float, notes: list[str]) -> bool:
        """Read what is there (waiting up to 50 ms); False once the process has ended."""
        if self.open and select.select([self.fd], [], [], 0.05)[0]:
            chunk = os.read(self.fd, 1 << 16)
            if chunk and len(self.buffer) < _MAX_TEST_BYTES:
                self.buffer += chunk
                *done, self.buffer = self.buffer.split(b"\n")
                self.lines += [d.decode("utf-8", "replace") for d in done]
            elif not chunk:
                self.open = False
        elif not self.open:
            time.sleep(0.002)
        if self.status is not None:
            return False
        pid, raw = os.waitpid(self.pid, os.WNOHANG | os.WUNTRACED)
        if pid and not os.WIFSTOPPED(raw):
            self.status = raw
            while self.open and select.select([self.fd], [], [], 0)[0]:   # what it wrote before it ended
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    break
                *done, self.buffer = (self.buffer + chunk).split(b"\n")
                self.lines += [d.decode("utf-8", "replace") for d in done]
            return False
        if pid:
            notes.append("the test's process stopped itself")
        elif time.monotonic() > deadline:
            notes.append("the test ran past its deadline")
        else:
            return True
        self.kill()
        return False

    def kill(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.status = os.waitpid(self.pid, 0)[1]
            self.status = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.open = False

    def result(self, index: int, deadline_s: float) -> tuple[list[str], int | None, list[str], bool]:
        """Test `index`'s lines, the exit status if the process ended, notes, whether it ended
        (self.tainted: whether the target ran in it). While the target has not run in this
        process its lines end at `done index`; once it has, every later line is that test's and
        the process must end."""
        notes: list[str] = []
        deadline = time.monotonic() + deadline_s
        mine: list[str] = []
        started = False
        alive = True
        while True:
            while self.lines:
                line = self.lines.pop(0)
                if line == "tainted":
                    self.tainted = True
                elif not started:
                    started = line == f"start {index}"
                    if not started:
                        notes.append(f"tampered: a line before test {index} started: {line[:80]!r}")
                elif line == f"done {index}" and not self.tainted:
                    self.next = index + 1
                    return mine, None, notes, False
                else:
                    mine.append(line)
            if not alive:
                break
            alive = self._pump(deadline, notes)
        self.kill()
        self.next = -1
        return mine, self.status, notes, True


class _Reporter:
    settings: tuple = ()

    def __init__(self, config) -> None:
        (self.fd, self.is_target, self.target, self.qualname, self.deadline_s, self.refused,
         self.arm, self.tainted, self.ran_in_reporter, self.refuse) = self.settings
        self.pm = config.pluginmanager
        self.items: list = []
        self.index: dict[int, int] = {}
        self.identities: dict[str, tuple] = {}
        self.tampered: list[str] = []
        self.machinery: tuple = ()
        self.hookimpls: frozenset = frozenset()
        self.runner: _Runner | None = None
        self.line = None   # in a runner: writes one of the runner's lines

    # --- the reporter ----------------------------------------------------------------
    def write(self, record: dict) -> None:
        if self.fd < 0:
            return
        view = memoryview((json.dumps(record) + "\n").encode())
        while view:
            view = view[os.write(self.fd, view):]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        self.items = items
        self.identities = {item.nodeid: _identity(item) for item in items}
        self.tampered += self.ran_in_reporter + self._binding()
        self.machinery = _snapshot()
        self.hookimpls = frozenset(_hooks(self.pm))

    def _binding(self) -> list[str]:
        """The name the tests import must end in the edited function's code."""
        if not self.qualname or not self.target.startswith("/repo/"):
            return []
        modname = self.target[len("/repo/"):-len(".py")].replace("/", ".").removesuffix(".__init__")
        mod = sys.modules.get(modname)
        if mod is None:
            return []
        obj = mod
        for part in self.qualname.split("."):
            obj = getattr(obj, part, None)
        codes = _codes_of(obj)
        if not codes or any(self.is_target(c) for c in codes):
            return []
        code = codes[0]
        return [f"{modname}.{self.qualname} resolves to other code ({code.co_qualname} at "
                f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}) than the edited function"]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.line is not None:
            return None   # in a runner: pytest's own protocol runs the test
        signal.setitimer(signal.ITIMER_REAL, 0)   # pytest-timeout's alarm is the runner's; the deadline is ours
        if not self.index:
            self.index = {id(it): i for i, it in enumerate(self.items)}
        index = self.index.get(id(item))
        if index is None:
            self.write({"nodeid": item.nodeid, "outcome": "failed", "why": ["not a collected test"]})
            return True
        if self.runner is None or self.runner.next != index:
            if self.runner is not None:
                self.runner.kill()
            self.runner = self._start(index)
        lines, status, notes, ended = self.runner.result(index, self.deadline_s)
        outcome = _decide(lines, status, notes, ended, self.runner.tainted)
        if outcome == "passed" and item.get_closest_marker("xfail") is not None:
            outcome = "xpassed"  # not a plain pass: excluded from PASS_TO_PASS when mining
        self.tampered += [f"{item.nodeid}: {n[len('tampered: '):]}" for n in notes if n.startswith("tampered")]
        self.refused += [n[len("refused: "):] for n in notes if n.startswith("refused")]
        self.write({"nodeid": item.nodeid, "outcome": outcome,
                    "why": [n for n in notes if not n.startswith(("tampered", "refused"))][:3]})
        return True

    def _start(self, first: int) -> _Runner:
        """Fork a runner for the tests from `first` on."""
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            self._run(first, write_fd)   # never returns
        os.close(write_fd)
        return _Runner(pid, read_fd, first)

    # --- a runner -------------------------------------------------------------------
    def _run(self, first: int, fd: int) -> None:
        """Run the tests from `first` on until the target's code has run (then that test is
        this process's last: its checks, `checked`, and the exit). Everything the lines and the
        checks depend on is bound here, before any test runs, to locals of this frame (which the
        target cannot reach) or to default arguments; the line texts are constants."""
        exit_ = _exit_now
        status = 3   # the runner could not finish its lines: its test fails on this status
        try:
            if self.fd >= 0:
                os.close(self.fd)
            self.fd = -1
            info = os.fstat(fd)
            pipe = (info.st_dev, info.st_ino)
            raw_line, tainted, changes, guard = _raw_line, self.tainted, _changes, _guarded_runtest
            items, identities = tuple(self.items), dict(self.identities)
            machinery, hookimpls, pm = self.machinery, self.hookimpls, self.pm
            line = _line_writer(fd, pipe)
            self.line = line
            self.arm(fd)
            own = _instance_snapshot(self)   # the reporter as this runner set it up
            for index in range(first, len(items)):
                item = items[index]
                raw_line(fd, pipe, f"start {index}\n".encode())
                item.runtest = guard(item, item.runtest, line)
                item.ihook.pytest_runtest_protocol(item=item, nextitem=items[index + 1] if index + 1 < len(items) else None)
                if tainted():
                    for note in changes(item, identities.get(item.nodeid), machinery, own, hookimpls, pm):
                        raw_line(fd, pipe, ("tampered " + note.replace("\n", " ")[:500] + "\n").encode("utf-8", "replace"))
                    raw_line(fd, pipe, b"checked\n")
                raw_line(fd, pipe, f"done {index}\n".encode())
                if tainted():
                    break
            status = 0
        except BaseException:
            pass
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                exit_(status)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        linecache.clearcache()   # no test source is handed out from a cache filled by earlier reports
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call, _status=_status):
        """Setup and teardown outcomes (the call's own is written by the guarded call); a
        failure seen here in the call phase too (a unittest item's) downgrades it."""
        if self.line is None:
            yield
            return
        before = _status(call.excinfo)
        yield
        after = _status(call.excinfo)
        status = "failed" if "failed" in (before, after) else "skipped" if "skipped" in (before, after) else "ok"
        if call.when != "call" or status != "ok":
            self.line(call.when if call.when != "call" else "report", status)

    def pytest_runtest_logreport(self, report) -> None:
        # reports can only downgrade an outcome (e.g. a failed subtest), never upgrade one
        if self.line is not None and report.failed:
            self.line("report", "failed")
            self._show(report)

    def _show(self, report) -> None:
        """A runner ends before pytest's failure summary would print, so a failure's text is
        printed as it happens: the test output shows what failed (`E  assert 50 == 10`, which
        the miner needs of a mutant). Text only: the outcome is the runner's lines."""
        terminal = self.pm.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(f"_____ {report.nodeid} ({report.when}) _____")
            terminal.write_line(report.longreprtext)

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.write({"collect_error": report.nodeid or "<session>", "message": str(report.longrepr)[-2000:]})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self.line is not None:
            return
        if self.runner is not None:
            self.runner.kill()
        if _changed(self.machinery):
            self.tampered.append(f"the reporter's pytest internals changed: {_changed(self.machinery)[:5]}")
        late = [r for r in self.ran_in_reporter if r not in self.tampered]   # e.g. a conftest's session hook
        self.write({"finished": True, "tampered": self.tampered + late, "refused": list(self.refused)})


def _line_writer(fd: int, pipe: tuple):
    """line(phase, status): the runner's line for it, a constant of the code below (no table to
    rewrite), written with the values bound as default arguments. A report line only ever says
    failed or skipped: `report ok` is no line of the runner's."""
    def line(phase: str, status: str, _fd=fd, _pipe=pipe, _raw=_raw_line) -> None:
        if phase == "setup":
            data = b"setup ok\n" if status == "ok" else b"setup skipped\n" if status == "skipped" else b"setup failed\n"
        elif phase == "call":
            data = b"call ok\n" if status == "ok" else b"call skipped\n" if status == "skipped" else b"call failed\n"
        elif phase == "teardown":
            data = (b"teardown ok\n" if status == "ok" else b"teardown skipped\n" if status == "skipped"
                    else b"teardown failed\n")
        else:
            data = b"report skipped\n" if status == "skipped" else b"report failed\n"
        _raw(_fd, _pipe, data)
    return line


def _guarded_runtest(item, runtest, line, _identity=_identity):
    """The test's call; its raw outcome is written before any hook or report sees it, by code
    whose every value is a default argument."""
    def guarded(_runtest=runtest, _item=item, _before=_identity(item), _line=line, _identity=_identity,
                _skipped=Skipped, _getattr=getattr, _all=all, isinstance=isinstance, BaseException=BaseException):
        try:
            _runtest()
        except BaseException as exc:
            _line("call", "skipped" if isinstance(exc, _skipped) else "failed")
            raise
        pending = _getattr(_item, "_excinfo", None)   # unittest items keep failures here
        if pending:
            _line("call", "skipped" if _all(e.errisinstance(_skipped) for e in pending) else "failed")
        else:
            _line("call", "failed" if _identity(_item) != _before else "ok")
    return guarded


def _guarded_exit(exit_, is_target, refuse):
    """os._exit while a test runs: refused to the target (it would end the test's process
    after forging its lines); a worker process a test forks (multiprocessing) still uses it."""
    def _exit(code, _exit_=exit_, _is_target=is_target, _refuse=refuse, _getframe=sys._getframe,
              RuntimeError=RuntimeError):
        frame = _getframe(1)
        while frame is not None:
            if _is_target(frame.f_code):
                _refuse("os._exit")
                raise RuntimeError("refused by the test harness: os._exit from the target")
            frame = frame.f_back
        _exit_(code)
    return _exit


def _changes(item, identity, machinery: tuple, own: tuple, hookimpls: frozenset, pm, _identity=_identity,
             _changed=_changed, _hooks=_hooks, sorted=sorted, str=str) -> list[str]:
    """What a test's process changed of what the reporter saw (the fork kept the ids): the test,
    pytest's and the verifier's modules, the builtins, the reporter, the plugins and hooks."""
    notes = []
    if identity != _identity(item):
        notes.append("test function replaced")
    changed = _changed(machinery) + _changed(own)
    if changed:
        notes.append(f"pytest or verifier internals changed: {changed[:5]}")
    hooks = _hooks(pm)
    if hooks != hookimpls:
        notes.append(f"plugins or hook implementations changed: {sorted(str(h[:2]) for h in hooks ^ hookimpls)[:5]}")
    return notes


_PHASES = ("setup", "call", "teardown")
_STATUSES = ("ok", "failed", "skipped")


def _decide(lines: list[str], status: int | None, notes: list[str], ended: bool, tainted: bool = False) -> str:
    """A test passed only if its lines say ok for every phase. A test the target's code ran in
    must also be its process's last, checked by its runner (`checked`) and ended through the
    runner with status 0. The lines are held to what the runner writes: each phase once and in
    order, report lines only for failures, nothing the runner does not write; any other line
    is tampering (only a forger writes one), and lines added can only lower the outcome."""
    phases: dict[str, set[str]] = {}
    order: list[str] = []
    checked = 0
    for line in lines:
        word, _, rest = line.partition(" ")
        if word in _PHASES and rest in _STATUSES:
            if word in phases:
                notes.append(f"tampered: the {word} phase reported twice")
            elif order and _PHASES.index(word) < _PHASES.index(order[-1]):
                notes.append(f"tampered: the {word} phase reported after {order[-1]}")
            phases.setdefault(word, set()).add(rest)
            order.append(word)
        elif word == "report" and rest in ("failed", "skipped"):
            phases.setdefault(word, set()).add(rest)
        elif line == "checked":
            checked += 1
        elif word in ("tampered", "refused"):
            notes.append(f"{word}: {rest}")
        elif word not in ("start", "done"):
            notes.append(f"tampered: a line the runner does not write: {line[:80]!r}")
    if ended and (status is None or status < 0 or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0):
        if status is not None and status >= 0:
            notes.append("the test's process did not end through the runner"
                         + (f" (signal {os.WTERMSIG(status)})" if os.WIFSIGNALED(status) else
                            f" (status {os.WEXITSTATUS(status)})"))
        return "failed"
    if ended and not any(line.startswith("done ") for line in lines):
        return "failed"
    if tainted and checked != 1:
        notes.append("tampered: the runner did not check its process once after the target ran")
        return "failed"
    seen = set().union(*phases.values()) if phases else set()
    if "failed" in seen:
        return "failed"
    if "skipped" in seen:
        return "skipped"
    if all(phases.get(p) == {"ok"} for p in _PHASES):
        return "passed"
    return "failed"


def pytest_configure(config) -> None:
    if not config.pluginmanager.has_plugin("rlvr_reporter"):
        config.pluginmanager.register(_Reporter(config), "rlvr_reporter")


_install()
