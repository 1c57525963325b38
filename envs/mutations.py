"""The `mutation` level: a one-token bug injected into one line of a real function or method.

The reachable end of the curriculum (SWE-smith's procedural bugs are the model): the task names
the function, the line and its (buggy) text, and the fix is one token on that line. Every
operator is a textual edit of one AST node that sits on one line, so the rest of the line keeps
its formatting and the reference fix is the original line exactly:

  flip_compare    `a < b` -> `a >= b`, `==` <-> `!=`, `is` <-> `is not`, `in` <-> `not in`
  drop_not        `not x` -> `x`
  off_by_one      an integer constant n -> n + 1
  swap_operands   `a - b` -> `b - a` (non-commutative operators, simple operands)
  bool_op         `and` <-> `or`
  arith_op        `+` <-> `-`
  wrong_return    `return x` -> `return y`, y another parameter of the function
  swap_args       `f(a, b)` -> `f(b, a)` (the first two positional arguments, simple ones)

Whether a mutant is a task is decided by running the suite (envs/mining.py): its FAIL_TO_PASS
tests must fail on it, the others pass, nothing stops importing, and the failures must show an
expected value against an actual one.
"""
from __future__ import annotations

import ast
import random
import re

_FLIP = {ast.Lt: ("<", ">="), ast.LtE: ("<=", ">"), ast.Gt: (">", "<="), ast.GtE: (">=", "<"),
         ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"),
         ast.In: ("in", "not in"), ast.NotIn: ("not in", "in")}
_NONCOMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_SIMPLE = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript)
OPERATORS = ("flip_compare", "drop_not", "off_by_one", "swap_operands", "bool_op", "arith_op",
             "wrong_return", "swap_args")


def _op_pattern(op: str) -> str:
    return r"\s+".join(rf"\b{w}\b" if w.isalpha() else re.escape(w) for w in op.split())


class _Line:
    """One source line as UTF-8 bytes: AST column offsets count bytes, not characters."""

    def __init__(self, text: str) -> None:
        self.raw = text.encode()

    def seg(self, a: int, b: int) -> str:
        return self.raw[a:b].decode()

    def replace(self, a: int, b: int, new: str) -> str:
        return (self.raw[:a] + new.encode() + self.raw[b:]).decode()


def _one_line(*nodes: ast.AST) -> bool:
    return all(getattr(n, "lineno", None) is not None and n.lineno == n.end_lineno == nodes[0].lineno
               for n in nodes)


def _gap_swap(line: _Line, left: ast.AST, right: ast.AST, old: str, new: str) -> str | None:
    """Replace operator `old` by `new` in the text between two operands (once)."""
    gap = line.seg(left.end_col_offset, right.col_offset)
    changed, n = re.subn(_op_pattern(old), new, gap, count=1)
    return line.replace(left.end_col_offset, right.col_offset, changed) if n else None


def _mutations(node: ast.AST, line: _Line, params: list[str]) -> list[tuple[str, str]]:
    """(operator, mutated line) for one node; [] when no operator applies."""
    out: list[tuple[str, str]] = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
        old, new = _FLIP[type(node.ops[0])]
        text = _gap_swap(line, node.left, node.comparators[0], old, new)
        if text:
            out.append(("flip_compare", text))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        head = line.seg(node.col_offset, node.operand.col_offset)
        if re.fullmatch(r"not\s+", head):
            out.append(("drop_not", line.replace(node.col_offset, node.operand.col_offset, "")))
    elif (isinstance(node, ast.Constant) and type(node.value) is int
          and line.seg(node.col_offset, node.end_col_offset) == str(node.value)):
        out.append(("off_by_one", line.replace(node.col_offset, node.end_col_offset, str(node.value + 1))))
    elif isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Add, ast.Sub)):
            old, new = ("+", "-") if isinstance(node.op, ast.Add) else ("-", "+")
            text = _gap_swap(line, node.left, node.right, old, new)
            if text:
                out.append(("arith_op", text))
        if isinstance(node.op, _NONCOMMUTATIVE) and isinstance(node.left, _SIMPLE) and isinstance(node.right, _SIMPLE):
            a, b = node.left, node.right
            swapped = (line.seg(b.col_offset, b.end_col_offset) + line.seg(a.end_col_offset, b.col_offset)
                       + line.seg(a.col_offset, a.end_col_offset))
            out.append(("swap_operands", line.replace(a.col_offset, b.end_col_offset, swapped)))
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        text = _gap_swap(line, node.values[0], node.values[1], old, new)
        if text:
            out.append(("bool_op", text))
    elif isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
        others = [p for p in params if p != node.value.id]
        if others:
            v = node.value
            out.append(("wrong_return", line.replace(v.col_offset, v.end_col_offset, others[0])))
    elif (isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args)
          and all(isinstance(a, _SIMPLE) for a in node.args[:2])):
        a, b = node.args[0], node.args[1]
        if line.seg(a.col_offset, a.end_col_offset) != line.seg(b.col_offset, b.end_col_offset):
            swapped = (line.seg(b.col_offset, b.end_col_offset) + line.seg(a.end_col_offset, b.col_offset)
                       + line.seg(a.col_offset, a.end_col_offset))
            out.append(("swap_args", line.replace(a.col_offset, b.end_col_offset, swapped)))
    return out


def function_mutations(fn: ast.FunctionDef, stmts: list[ast.stmt], lines: list[str]) -> list[tuple[int, str, str]]:
    """Every (line number, operator, mutated line) of a function's body (docstring excluded)."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    out = []
    for stmt in stmts:
        for node in ast.walk(stmt):
            parts = [node] + [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
            if not _one_line(*parts):
                continue
            original = lines[node.lineno - 1]
            for op, text in _mutations(node, _Line(original), params):
                if text != original and text.strip():
                    out.append((node.lineno, op, text))
    return out


def pick_mutations(rel: str, qualname: str, fn: ast.FunctionDef, stmts: list[ast.stmt], lines: list[str],
                   per_function: int = 2) -> list[tuple[int, str, str]]:
    """At most `per_function` (line number, operator, mutated line) of one function, each a
    different operator and line, chosen reproducibly (seeded by the function's path and name)
    among the mutants whose module still compiles."""
    muts = function_mutations(fn, stmts, lines)
    random.Random(f"{rel}:{qualname}").shuffle(muts)
    muts.sort(key=lambda m: m[1] == "swap_args")   # the most frequent and least telling operator: last
    out: list[tuple[int, str, str]] = []
    used_ops, used_lines = set(), set()
    for line_no, op, text in muts:
        if len(out) >= per_function:
            break
        if op in used_ops or line_no in used_lines:
            continue
        text = text if text.endswith("\n") else text + "\n"
        try:
            compile("".join(lines[:line_no - 1]) + text + "".join(lines[line_no:]), rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            continue
        out.append((line_no, op, text))
        used_ops.add(op)
        used_lines.add(line_no)
    return out


EXPECTED_ACTUAL = re.compile(r"^E\s+(assert\b|AssertionError\b)", re.M)


def shows_expected_actual(output: str) -> bool:
    """A failing test's output compares an expected value with the actual one (pytest's
    assertion rewriting prints `E  assert <actual> == <expected>`), so the agent can tell what
    the buggy line computes wrong rather than only that something raised."""
    return bool(EXPECTED_ACTUAL.search(output))
