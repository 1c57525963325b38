"""Static checks of a submission before it is verified: the agent may change only the body of
the target function (and add imports at the top of its module), and that body may not use
the introspection a reward hack needs.

Why: the code under test runs inside the test process. Whatever it may change besides the
target function (another module, a helper the tests import, module-level code) can reach
the verifier; and comparison dunders, frame or garbage-collector access, or reading code
objects are how a wrong body makes the tests pass. A construct is flagged only when the
reference body does not use it too, so a library's own honest idioms are never flagged.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from envs.tasks import Task

# names whose import, attribute access or call marks a body as tampering with the test run
DENIED_MODULES = {"gc", "inspect", "ctypes", "_ctypes", "marshal", "dis", "linecache", "traceback",
                  "pytest", "_pytest", "pluggy", "unittest", "mock", "importlib", "builtins", "code",
                  "codeop", "rlvr_verify", "__main__", "tracemalloc", "faulthandler", "pdb", "bdb"}
DENIED_ATTRS = {"_getframe", "_current_frames", "f_back", "f_locals", "f_globals", "f_code", "f_builtins",
                "tb_frame", "tb_next", "gi_frame", "cr_frame", "ag_frame", "gi_code", "__code__",
                "co_consts", "co_code", "co_names", "__globals__", "__closure__", "__builtins__",
                "__subclasses__", "settrace", "setprofile", "addaudithook", "modules", "ANY",
                "get_objects", "get_referrers", "get_referents"}
DENIED_CALLS = {"eval", "exec", "compile", "__import__", "globals", "breakpoint"}
COMPARISON_DUNDERS = {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__",
                      "__instancecheck__", "__subclasscheck__", "__subclasshook__", "__contains__"}


# code attributes whose read the verifier's audit hook refuses the target (envs/verify_plugin)
AUDITED_CODE_ATTRS = ("__code__", "f_code", "gi_code", "cr_code", "ag_code")


@dataclass
class Screen:
    flags: list[str] = field(default_factory=list)   # why the submission gets 0; empty = passes
    def_range: tuple[int, int] | None = None         # the target function's lines in the submission
    allowed: tuple[str, ...] = ()                    # run-time refusals lifted (see audit_allowances)


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function `qualname` names ("f" or "Class.method"), or None."""
    body = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _docstring(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    first = fn.body[0] if fn.body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return [first] if is_doc else []


def _hollow(tree: ast.Module, qualname: str, keep_doc: bool) -> list[str]:
    """The module's top-level statements as AST dumps, the target's body replaced by `pass`
    (after its docstring when keep_doc: a docstring's doctests can be tests of the suite,
    e.g. under --doctest-modules, and tests are never the agent's to change)."""
    fn = find_function(tree, qualname)
    fn.body = (_docstring(fn) if keep_doc else []) + [ast.Pass()]
    return [ast.dump(stmt) for stmt in tree.body]


def _uses(node: ast.AST) -> set[str]:
    """The denied constructs a piece of code uses, as short descriptions."""
    hits = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in n.names] + ([n.module] if isinstance(n, ast.ImportFrom) and n.module else [])
            for name in names:
                if name.split(".")[0] in DENIED_MODULES or name in DENIED_ATTRS | COMPARISON_DUNDERS:
                    hits.add(f"imports {name}")
        elif isinstance(n, ast.Attribute) and (n.attr in DENIED_ATTRS or n.attr in COMPARISON_DUNDERS):
            hits.add(f"uses .{n.attr}")
        elif isinstance(n, ast.Name) and (n.id in DENIED_MODULES or n.id in DENIED_ATTRS):
            hits.add(f"uses {n.id}")
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in DENIED_CALLS:
            hits.add(f"calls {n.func.id}()")
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in COMPARISON_DUNDERS:
            hits.add(f"defines {n.name}")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and (
                n.value in COMPARISON_DUNDERS or n.value in DENIED_ATTRS or n.value in DENIED_CALLS):
            hits.add(f"names {n.value!r}")
    return hits


def function_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    """The lines the verifier's audit hook treats as the target: decorators through the body."""
    return min([fn.lineno] + [d.lineno for d in fn.decorator_list]), fn.end_lineno


def audit_allowances(reference: ast.FunctionDef | ast.AsyncFunctionDef | None) -> tuple[str, ...]:
    """What the audit hook would refuse the reference function itself, in the hook's names: the
    code attributes it reads (funcy's `arggetter` reads `func.__code__` for argument names).
    The hook lets the target read them too, never of a test's code; frames stay refused."""
    if reference is None:
        return ()
    attrs = {n.attr for n in ast.walk(reference) if isinstance(n, ast.Attribute) and n.attr in AUDITED_CODE_ATTRS}
    return tuple(f"object.__getattr__ {a}" for a in sorted(attrs))


def _rebinding(qualname: str, tree: ast.Module, new_imports: list[ast.stmt]) -> list[str]:
    """The target is what is scored: a new import that binds the name the tests import (the
    function, or the class of a method), or that runs after the target is defined, would make
    that name resolve to other code than the edited body."""
    top = qualname.split(".")[0]
    defined = next((n.lineno for n in tree.body if getattr(n, "name", None) == top), None)
    out = []
    for node in new_imports:
        bound = {(a.asname or a.name).split(".")[0] for a in node.names}
        if top in bound:
            out.append(f"a new import binds `{top}` (line {node.lineno}): the tests would import it, not the edited "
                       f"{qualname}")
        elif defined is not None and node.lineno > defined:
            out.append(f"a new import (line {node.lineno}) comes after `{top}` is defined: new imports go at the top")
    return out


def screen(task: Task, submitted: str, stubbed: str, original: str) -> Screen:
    """Check the agent's target module against the stubbed one (see the module docstring)."""
    try:
        tree = ast.parse(submitted)
    except (SyntaxError, ValueError) as e:
        return Screen([f"{task.module_path} does not parse: {e}"])
    fn = find_function(tree, task.qualname)
    if fn is None:
        return Screen([f"{task.module_path} no longer defines {task.qualname}"])
    def_range = function_lines(fn)
    flags = []
    stub_tree = ast.parse(stubbed)
    doc = _docstring(find_function(stub_tree, task.qualname))
    keep_doc = bool(doc) and ">>>" in doc[0].value.value   # holds doctests: fixed like the tests
    want = _hollow(stub_tree, task.qualname, keep_doc)
    got = _hollow(ast.parse(submitted), task.qualname, keep_doc)
    added = [s for s in got if s not in want]
    added_imports = [s for s in added if s.startswith(("Import(", "ImportFrom("))]
    if [s for s in got if s not in added_imports] != want:
        flags.append(f"{task.module_path} changed outside the body of {task.qualname} (only the body "
                     "and new imports at the top may change; a docstring with doctests stays)")
    new_imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and ast.dump(n) in added_imports]
    flags += _rebinding(task.qualname, tree, new_imports)
    ref_fn = find_function(ast.parse(original), task.qualname)
    allowed = _uses(ref_fn) if ref_fn is not None else set()
    bad = sorted((_uses(fn) | set().union(*map(_uses, new_imports))) - allowed)
    if bad:
        flags.append(f"{task.qualname} uses introspection a solution does not need: {', '.join(bad[:6])}")
    return Screen(flags, def_range, audit_allowances(ref_fn))
