"""Mine stub-a-function tasks from a library's sdist, every test run sandboxed.

1. baseline the suite twice; tests passing both times are the stable set (flaky ones drop);
2. one coverage run with per-test contexts tells which tests execute each function body;
3. for each module-level function with a non-trivial body that some test touched, replace
   the body (docstring and signature kept) with a stub and run the whole suite once: every
   stable test that now fails is FAIL_TO_PASS (coverage cannot see a body run in a child
   process, e.g. a test that runs the library's CLI in a subprocess: those tests are found
   here, and recorded in meta["f2p_outside_coverage"]); PASS_TO_PASS is the rest.
Dropped: bodies run at import (the stub would break importing), bodies shorter than
MIN_BODY_LINES, duplicate bodies, functions whose stub no test notices, and stubs that break
more than MAX_F2P_FRACTION of the suite (not a task about one function any more).
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from envs.reward import is_test_path
from envs.sandbox import Limits, QuotaDir, Sandbox, chown_tree
from envs.sdist import SdistInfo, lookup, pristine_tree
from envs.tasks import Task
from envs.testrun import BASE_PYTEST, run_tests
from rl.paths import DEFAULT_WORK_ROOT

MIN_BODY_LINES = 2   # a one-line body (`return x`) is too trivial to be a task
MAX_F2P_FRACTION = 0.5
COVERAGE_RC = "[run]\nbranch = False\n[json]\nshow_contexts = True\n"


@dataclass
class Candidate:
    module_path: str
    qualname: str
    start: int
    end: int
    body: str
    indent: str
    tests: set[str] = field(default_factory=set)


@dataclass
class MiningReport:
    library: str
    version: str
    functions: int = 0
    tasks: int = 0
    dropped: dict = field(default_factory=dict)
    stable_tests: int = 0
    flaky_tests: int = 0
    seconds: float = 0.0


def find_packages(tree: Path) -> tuple[str, list[str]]:
    """(source root relative to the tree, its top-level packages): flat or src/ layout."""
    for root in ("", "src"):
        base = tree / root
        if not base.is_dir():
            continue
        pkgs = sorted(p.name for p in base.iterdir()
                      if p.is_dir() and (p / "__init__.py").exists() and not is_test_path(p.name + "/x.py"))
        if pkgs:
            return root, pkgs
    return "", []


def function_candidates(tree: Path, packages: list[str], src_root: str = "") -> list[Candidate]:
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
            for node in mod.body:
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                stmts = node.body
                if (stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant)
                        and isinstance(stmts[0].value.value, str)):
                    stmts = stmts[1:]
                if not stmts or stmts[0].lineno == node.lineno:
                    continue
                start, end = stmts[0].lineno, node.end_lineno
                if stmts[0].col_offset == 0 or lines[start - 1][:stmts[0].col_offset].strip():
                    continue   # body does not start its own line
                body = "".join(lines[start - 1:end])
                out.append(Candidate(rel, node.name, start, end, body, " " * stmts[0].col_offset))
    return out


def stub_for(c: Candidate) -> str:
    return f'{c.indent}raise NotImplementedError("{c.qualname} is not implemented yet")\n'


def problem_statement(library: str, c: Candidate, src_root: str = "") -> str:
    module = c.module_path[len(src_root) + 1:] if src_root else c.module_path
    dotted = module[:-3].replace("/", ".").removesuffix(".__init__")
    return (f"Implement `{dotted}.{c.qualname}` in {c.module_path}: its body was removed and now raises "
            f"NotImplementedError; its signature and docstring say what it must do. Make the "
            f"repository's tests pass without changing the tests.")


def _coverage_contexts(sandbox: Sandbox, checkout: Path, packages: list[str], test_command: list[str],
                       timeout_s: float) -> dict[str, dict[int, set[str]]]:
    """file -> line -> set of test node ids (\"\" = executed outside any test, e.g. at import)."""
    (checkout / ".rlvr-coveragerc").write_text(COVERAGE_RC)
    chown_tree(checkout, sandbox.uid)
    cov_args = [f"--cov={p}" for p in packages] + ["--cov-context=test", "--cov-report=",
                                                     "--cov-config=.rlvr-coveragerc"]
    run = run_tests(sandbox, test_command, timeout_s=timeout_s, extra_args=cov_args)
    if not run.finished:
        raise RuntimeError(f"coverage run did not finish:\n{run.output[-3000:]}")
    res = sandbox.run_argv(["python", "-m", "coverage", "json", "--rcfile=.rlvr-coveragerc",
                            "-o", ".rlvr-cov.json", "-q"], timeout_s)
    report = checkout / ".rlvr-cov.json"
    if res.exit_code != 0 or not report.is_file() or report.is_symlink():
        raise RuntimeError(f"coverage json failed (exit {res.exit_code}): {res.output[-2000:]}")
    data = json.loads(report.read_text())
    out: dict[str, dict[int, set[str]]] = {}
    for fname, info in data["files"].items():
        ctx = info.get("contexts", {})
        out[fname] = {int(line): {c.rsplit("|", 1)[0] for c in names} for line, names in ctx.items()}
    return out


def missing_modules(run) -> list[str]:
    return sorted({m for msg in run.collect_messages for m in re.findall(r"No module named '([\w.]+)'", msg)})


def baseline_error(library: str, run) -> str:
    """Why a baseline ran no test: the collection errors, and the modules they miss."""
    missing = missing_modules(run)
    text = (f"{library}: the baseline test run collected {len(run.outcomes) or 'no'} test(s); "
            f"{len(run.collect_errors)} collection error(s):\n")
    text += "\n".join(f"--- {e}\n{m[-800:]}" for e, m in zip(run.collect_errors[:5], run.collect_messages))
    if missing:
        text += (f"\nThe tests import modules the sandbox Python lacks: {', '.join(missing)}. They are "
                 "test-only dependencies of the library; install them into the sandbox Python "
                 "(scripts/setup.sh's sandbox venv) before mining.")
    return text + f"\n{run.output[-1500:]}"


def mine(library: str, version: str | None = None, work_root: str | Path = DEFAULT_WORK_ROOT,
         uid_base: int = 61900, workers: int = 2, limit: int | None = None,
         timeout_s: float = 600.0, per_test_timeout_s: float = 10.0,
         log: Callable[[str], None] = print) -> tuple[list[Task], MiningReport]:
    info: SdistInfo = lookup(library, version)
    return mine_tree(info, pristine_tree(info), work_root, uid_base, workers, limit, timeout_s,
                     per_test_timeout_s, log)


def mine_tree(info: SdistInfo, tree: Path, work_root: str | Path = "/tmp/agentic-rlvr-work",
              uid_base: int = 61900, workers: int = 2, limit: int | None = None,
              timeout_s: float = 600.0, per_test_timeout_s: float = 10.0,
              log: Callable[[str], None] = print) -> tuple[list[Task], MiningReport]:
    """mine() on an extracted tree (the sdist's top directory)."""
    t0 = time.monotonic()
    library = info.library
    src_root, packages = find_packages(tree)
    if not packages:
        raise ValueError(f"{info.filename}: no package directory found at the top or under src/")
    test_command = list(BASE_PYTEST) + (["-o", f"pythonpath={src_root}"] if src_root else [])
    report = MiningReport(library, info.version)
    root = Path(work_root)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    limits = Limits(cpu_s=int(timeout_s), memory_mib=4096, max_processes=256, max_file_mib=256)

    def workspace(i: int) -> tuple[QuotaDir, Path, Sandbox]:
        q = QuotaDir(root / f"mine-{library}-{uuid.uuid4().hex[:8]}", 1024)
        co = q.path / "repo"
        shutil.copytree(tree, co, symlinks=True)
        chown_tree(co, uid_base + i)
        return q, co, Sandbox(co, uid=uid_base + i, limits=limits, max_output_chars=200_000)

    spaces = [workspace(i) for i in range(max(1, workers))]
    try:
        _, co0, sb0 = spaces[0]
        runs = [run_tests(sb0, test_command, timeout_s=timeout_s, per_test_timeout_s=per_test_timeout_s,
                          extra_args=["--continue-on-collection-errors"]) for _ in range(2)]
        for r in runs:
            if not r.finished or r.tampered:
                raise RuntimeError(f"{library}: baseline test run failed:\n{r.output[-3000:]}")
            if not r.outcomes:
                raise RuntimeError(baseline_error(library, r))
        broken = set(runs[0].collect_errors)   # files that never collect: their tests are no one's
        if broken:
            miss = missing_modules(runs[0])
            log(f"[mine] warning: {len(broken)} test file(s) do not collect: {', '.join(sorted(broken)[:8])}"
                + (f"; they import modules the sandbox Python lacks: {', '.join(miss)} (test-only "
                   "dependencies: install them into the sandbox Python to mine those tests)" if miss else "")
                + "; mining the tests that do collect")
            test_command.append("--continue-on-collection-errors")   # else pytest runs no test at all
        stable = runs[0].passed & runs[1].passed
        report.stable_tests = len(stable)
        report.flaky_tests = len(runs[0].passed ^ runs[1].passed)
        log(f"[mine] {info.filename}: {len(stable)} stable passing tests, {report.flaky_tests} flaky, "
            f"{len(runs[0].outcomes) - len(runs[0].passed)} not passing")
        contexts = _coverage_contexts(sb0, co0, packages, test_command, timeout_s)
        cands = function_candidates(tree, packages, src_root)
        report.functions = len(cands)
        kept: list[Candidate] = []
        seen_bodies: set[str] = set()
        dropped = report.dropped
        for c in cands:
            lines = contexts.get(c.module_path, {})
            covered = [lines[n] for n in range(c.start, c.end + 1) if n in lines]
            tests = set().union(*covered) if covered else set()
            key = textwrap.dedent(c.body).strip()
            if c.end - c.start + 1 < MIN_BODY_LINES:
                dropped["trivial"] = dropped.get("trivial", 0) + 1
            elif "" in tests:
                dropped["runs_at_import"] = dropped.get("runs_at_import", 0) + 1
            elif key in seen_bodies:
                dropped["duplicate"] = dropped.get("duplicate", 0) + 1
            elif not tests & stable:
                dropped["untested"] = dropped.get("untested", 0) + 1
            else:
                seen_bodies.add(key)
                c.tests = tests & stable
                kept.append(c)
        if limit is not None:
            kept = kept[:limit]

        def probe(args: tuple[int, Candidate]) -> Task | None:
            i, c = args
            _, co, sb = spaces[i % len(spaces)]
            module = co / c.module_path
            original = (tree / c.module_path).read_text()
            lines = original.splitlines(keepends=True)
            stub = stub_for(c)
            module.write_text("".join(lines[:c.start - 1]) + stub + "".join(lines[c.end:]))
            try:
                run = run_tests(sb, test_command, timeout_s=timeout_s, per_test_timeout_s=per_test_timeout_s)
            finally:
                module.write_text(original)
            if set(run.collect_errors) - broken or not run.finished:
                return None
            f2p = sorted(t for t in stable if run.outcomes.get(t) != "passed")
            if not f2p or len(f2p) > MAX_F2P_FRACTION * len(stable):
                return None
            return Task(
                id=f"{library}-{info.version}:{c.module_path}:{c.qualname}", library=library,
                version=info.version, sdist_filename=info.filename, sdist_sha256=info.sha256,
                sdist_url=info.url, module_path=c.module_path, qualname=c.qualname,
                body_start_line=c.start, body_end_line=c.end, original_body=c.body, stub_body=stub,
                fail_to_pass=f2p, pass_to_pass=sorted(stable - set(f2p)), test_command=test_command,
                problem_statement=problem_statement(library, c, src_root),
                meta={"candidate_tests": len(c.tests), "body_lines": c.end - c.start + 1,
                      "f2p_outside_coverage": sorted(set(f2p) - c.tests)})

        # each worker owns one workspace: probe i runs in workspace i % workers, so split by it
        order = list(enumerate(kept))
        with ThreadPoolExecutor(max_workers=len(spaces)) as pool:
            lanes = [[a for a in order if a[0] % len(spaces) == w] for w in range(len(spaces))]
            results_by_lane = list(pool.map(lambda lane: [probe(a) for a in lane], lanes))
        by_index: dict[int, Task | None] = {}
        for lane, results in zip(lanes, results_by_lane):
            for (i, _), t in zip(lane, results):
                by_index[i] = t
        tasks = [by_index[i] for i in sorted(by_index) if by_index[i] is not None]
        dropped["stub_not_detected_or_breaks_import"] = len(kept) - len(tasks)
        report.tasks = len(tasks)
        report.seconds = time.monotonic() - t0
        log(f"[mine] {library} {info.version}: {len(tasks)} tasks from {len(cands)} functions "
            f"in {report.seconds:.1f}s; dropped {dropped}")
        return tasks, report
    finally:
        for q, _, _ in spaces:
            q.close()
