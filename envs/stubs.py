"""Where a task's stub goes: candidate spans of real functions and methods, one per difficulty level.

Levels, hardest first: "body" stubs the whole body (docstring and signature kept); the partial
levels remove part of a function and leave a marked hole, so the rest of the function is context
the agent can read. The stub line is always the same text, `raise NotImplementedError` at the
hole's indentation (MARKER), so an edit's `oldText` is one constant the model can copy; a module
that already holds that text elsewhere gives no stub candidates (the marker must be unique):
  "last_lines"  the function's last k lines (k about a third of the body, at a statement boundary);
  "branch"      the body of one `if`/`else` branch;
  "return"      one `return <expression>` statement;
  "statement"   one other simple statement (an assignment or a call);
  "mutation"    no hole: a one-token bug in one line (envs/mutations.py), the easiest level.
Each function gives at most one candidate per level (the largest fitting span), and a partial
span must leave the module compiling. Module-level functions and methods of module-level classes
are candidates (qualname "Class.method").
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from envs.mutations import pick_mutations
from envs.reward import is_test_path
from envs.tasks import LEVELS

MIN_BODY_LINES = 2      # a one-line body (`return x`) is too trivial to be a task
MIN_PARTIAL_LINES = 3   # a partial stub leaves some of the body: the body needs a few lines
MARKER = "raise NotImplementedError"
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass
class Candidate:
    module_path: str
    qualname: str
    start: int              # 1-based lines the stub replaces, inclusive
    end: int
    body: str               # their exact text
    indent: str
    level: str = "body"
    fn_start: int = 0       # the whole body's lines (the import check and deduplication use them)
    fn_end: int = 0
    fn_body: str = ""
    tests: set[str] = field(default_factory=set)
    replacement: str = ""   # mutation: the mutated line
    operator: str = ""      # mutation: which operator made it

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Two candidates with the same key are the same task (a body copied between modules)."""
        return (self.level, textwrap.dedent(self.fn_body).strip(), textwrap.dedent(self.body).strip(),
                self.replacement.strip())


def stub_for(c: Candidate) -> str:
    """What replaces the candidate's lines: the mutated line, or the marker line."""
    if c.level == "mutation":
        return c.replacement
    return f"{c.indent}{MARKER}\n"


def problem_statement(c: Candidate, src_root: str = "") -> str:
    module = c.module_path[len(src_root) + 1:] if src_root else c.module_path
    dotted = module[:-3].replace("/", ".").removesuffix(".__init__")
    if c.level == "mutation":
        return (f"`{dotted}.{c.qualname}` in {c.module_path} has a bug on line {c.start}, which reads "
                f"`{c.replacement.strip()}`: one token of that line is wrong (an operator, a constant, a name, "
                f"or the order of two operands). Fix that line so that the repository's tests pass, without "
                f"changing the tests.")
    if c.level == "body":
        return (f"Implement `{dotted}.{c.qualname}` in {c.module_path}: its body was removed and is now the "
                f"line `{MARKER}`; its signature and docstring say what it must do. Make the "
                f"repository's tests pass without changing the tests.")
    what = {"last_lines": f"its last {c.end - c.start + 1} lines", "branch": "the body of one branch",
            "return": "one return statement", "statement": "one statement"}[c.level]
    return (f"Part of `{dotted}.{c.qualname}` in {c.module_path} was removed: {what}. That spot "
            f"(line {c.start}) now reads `{MARKER}`. Restore the missing code so that the "
            f"repository's tests pass, without changing the tests.")


def _functions(mod: ast.Module):
    """(qualname, node) of module-level functions and of methods of module-level classes."""
    for node in mod.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{sub.name}", sub


def _statements(stmts: list[ast.stmt]):
    """Every statement of a body, nested blocks included, nested functions and classes not."""
    for s in stmts:
        yield s
        if isinstance(s, _NESTED):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(s, name, []) or [])
        for h in getattr(s, "handlers", []) or []:
            yield from _statements(h.body)
        for case in getattr(s, "cases", []) or []:
            yield from _statements(case.body)


def _size(node: ast.AST) -> int:
    return sum(1 for _ in ast.walk(node))


def _own_line(lines: list[str], node: ast.AST) -> bool:
    return node.col_offset > 0 and not lines[node.lineno - 1][:node.col_offset].strip()


def _partial_spans(fn: ast.FunctionDef, stmts: list[ast.stmt], lines: list[str]) -> dict[str, tuple[int, int, int]]:
    """level -> (first line, last line, indent column) of the largest fitting span."""
    start, end = stmts[0].lineno, fn.end_lineno
    n = end - start + 1
    every = [s for s in _statements(stmts) if _own_line(lines, s)]
    out: dict[str, tuple[int, int, int]] = {}
    rets = [s for s in every if isinstance(s, ast.Return) and s.value is not None
            and not isinstance(s.value, (ast.Constant, ast.Name))]
    if rets:
        r = max(rets, key=lambda s: _size(s.value))
        out["return"] = (r.lineno, r.end_lineno, r.col_offset)
    simple = [s for s in every if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign))
              or (isinstance(s, ast.Expr) and isinstance(s.value, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom)))]
    if simple:
        s = max(simple, key=_size)
        out["statement"] = (s.lineno, s.end_lineno, s.col_offset)
    branches = []
    for s in every:
        if isinstance(s, ast.If):
            blocks = [s.body] + ([s.orelse] if s.orelse and not (len(s.orelse) == 1 and isinstance(s.orelse[0], ast.If)
                                                                  and s.orelse[0].col_offset == s.col_offset) else [])
            for b in blocks:
                if _own_line(lines, b[0]) and b[0].lineno > s.lineno:
                    size = b[-1].end_lineno - b[0].lineno + 1
                    if size <= max(1, n // 2):
                        branches.append((size, b[0].lineno, b[-1].end_lineno, b[0].col_offset))
    if branches:
        _, a, b, col = max(branches)
        out["branch"] = (a, b, col)
    want = max(2, round(n / 3))
    cuts = [(abs((end - s.lineno + 1) - want), -s.lineno, s) for s in every if 2 <= end - s.lineno + 1 < n]
    if cuts:
        s = min(cuts, key=lambda c: c[:2])[2]
        out["last_lines"] = (s.lineno, end, s.col_offset)
    return out


def candidates(tree: Path, packages: list[str], src_root: str = "",
               levels: tuple[str, ...] = ("body",)) -> list[Candidate]:
    """Candidate stubs of every function and method under the packages, at the given levels."""
    unknown = set(levels) - set(LEVELS)
    if unknown:
        raise ValueError(f"unknown difficulty level(s) {sorted(unknown)}; the levels are {', '.join(LEVELS)}")
    out = []
    for pkg in packages:
        for path in sorted((tree / src_root / pkg).rglob("*.py")):
            rel = str(path.relative_to(tree))
            if is_test_path(rel):
                continue
            source = path.read_text()
            try:
                mod = ast.parse(source)
            except SyntaxError:
                continue
            lines = source.splitlines(keepends=True)
            marker_free = MARKER not in source
            for qualname, node in _functions(mod):
                stmts = node.body
                if (stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant)
                        and isinstance(stmts[0].value.value, str)):
                    stmts = stmts[1:]
                if not stmts or stmts[0].lineno == node.lineno or not _own_line(lines, stmts[0]):
                    continue   # no body, or a body that does not start its own line
                start, end = stmts[0].lineno, node.end_lineno
                fn_body = "".join(lines[start - 1:end])
                if "mutation" in levels:
                    for n, op, text in pick_mutations(rel, qualname, node, stmts, lines):
                        original = lines[n - 1]
                        if not mutant_line_unique(lines, n, text):
                            continue
                        out.append(Candidate(rel, qualname, n, n, original, original[:len(original) - len(original.lstrip())],
                                             "mutation", start, end, fn_body, replacement=text, operator=op))
                if not marker_free:
                    continue
                spans = {"body": (start, end, stmts[0].col_offset)} if "body" in levels else {}
                if end - start + 1 >= MIN_PARTIAL_LINES:
                    spans.update({k: v for k, v in _partial_spans(node, stmts, lines).items() if k in levels})
                seen = set()
                for level in LEVELS:
                    if level == "mutation" or level not in spans or spans[level][:2] in seen:
                        continue
                    a, b, col = spans[level]
                    seen.add((a, b))
                    c = Candidate(rel, qualname, a, b, "".join(lines[a - 1:b]), " " * col, level,
                                  start, end, fn_body)
                    if level != "body" and not _compiles(lines, c, rel):
                        continue
                    out.append(c)
    return out


def mutant_line_unique(lines: list[str], n: int, text: str) -> bool:
    """The mutated line's text occurs once in the mutated module, so the line the statement
    quotes is an `oldText` the edit tool accepts as it is."""
    mutated = "".join(lines[:n - 1]) + text + "".join(lines[n:])
    return mutated.count(text.strip()) == 1


def _compiles(lines: list[str], c: Candidate, filename: str) -> bool:
    text = "".join(lines[:c.start - 1]) + stub_for(c) + "".join(lines[c.end:])
    try:
        compile(text, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True
