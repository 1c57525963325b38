"""Mine stub-a-function tasks from a library's sdist, every test run sandboxed.

1. baseline the suite twice; tests passing both times are the stable set (flaky ones drop);
   the library's declared test dependencies come from a read-only overlay (envs/testdeps.py);
2. one coverage run with per-test contexts tells which tests execute each line;
3. for each candidate stub (envs/stubs.py: whole bodies and partial stubs of functions and
   methods, one per difficulty level) whose lines some test ran, write the stub and run the
   whole suite once: every stable test that now fails is FAIL_TO_PASS (coverage cannot see a
   body run in a child process, e.g. a test that runs the library's CLI in a subprocess: those
   tests are found here, and recorded in meta["f2p_outside_coverage"]); PASS_TO_PASS is the rest.
Every task's FAIL_TO_PASS tests pass on the original code under the verifier's audit hook.
4. the suite runs once more with the recording plugin: the plain-data arguments the tests pass
   to each task's function, and perturbed ones, become the task's differential-gate inputs
   (envs/gate.py `annotate`; a task's `gate` says why it has none).
A partial stub is kept only if its hole matters: with the hole simply deleted (`pass` in its
place) some FAIL_TO_PASS test still fails, so removing the marker is never a solution.
Dropped: bodies run at import (the stub would break importing), bodies shorter than
MIN_BODY_LINES, duplicates, stubs no test notices, stubs that break collecting, deletable
holes, mutants whose failing tests show no expected-against-actual comparison (the `mutation`
level, envs/mutations.py), and stubs that break more than MAX_F2P_FRACTION of the suite (not a task about one
function any more).
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from envs.gate import annotate
from envs.mutations import shows_expected_actual
from envs.reward import is_test_path
from envs.sandbox import INSIDE_REPO, Limits, QuotaDir, Sandbox, chown_tree
from envs.screen import audit_allowances, find_function, function_lines
from envs.sdist import SdistInfo, lookup, pristine_tree
from envs.stubs import MIN_BODY_LINES, Candidate, candidates, problem_statement, stub_for
from envs.tasks import Task
from envs.testdeps import Overlay, overlay_for_sdist
from envs.testrun import BASE_PYTEST, run_tests
from rl.paths import DEFAULT_WORK_ROOT

MAX_F2P_FRACTION = 0.5
PROBE_FACTOR, PROBE_MIN_S = 4.0, 60.0   # a probe's suite run may take this many baselines (at least the floor)
COVERAGE_RC = "[run]\nbranch = False\n[json]\nshow_contexts = True\n"


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
    levels: dict = field(default_factory=dict)      # level -> tasks
    test_deps: list = field(default_factory=list)   # the overlay's pinned distributions


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
    """Whole-body candidates (the "body" level) of every function and method."""
    return candidates(tree, packages, src_root, ("body",))


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


def _add_hint(library: str, missing: list[str]) -> str:
    top = sorted({m.split(".")[0] for m in missing})
    return (f"no declared test dependency of the library provides them; add them with `rlvr tasks mine {library} "
            f"--test-deps {' '.join(top)}` (the PyPI name may differ from the module name)")


def baseline_error(library: str, run) -> str:
    """Why a baseline ran no test: the collection errors, and the modules they miss."""
    missing = missing_modules(run)
    text = (f"{library}: the baseline test run collected {len(run.outcomes) or 'no'} test(s); "
            f"{len(run.collect_errors)} collection error(s):\n")
    text += "\n".join(f"--- {e}\n{m[-800:]}" for e, m in zip(run.collect_errors[:5], run.collect_messages))
    if missing:
        text += f"\nThe tests import modules the sandbox Python lacks: {', '.join(missing)}. {_add_hint(library, missing)}."
    return text + f"\n{run.output[-1500:]}"


def mine(library: str, version: str | None = None, work_root: str | Path = DEFAULT_WORK_ROOT,
         uid_base: int = 61900, workers: int = 2, limit: int | None = None,
         timeout_s: float = 600.0, per_test_timeout_s: float = 10.0,
         log: Callable[[str], None] = print, levels: tuple[str, ...] = ("body",),
         test_deps: tuple[str, ...] = (), max_per_level: int | None = None,
         progress: Path | None = None) -> tuple[list[Task], MiningReport]:
    """Mine `library`'s sdist; its declared test dependencies (and `test_deps`) go into an overlay."""
    info: SdistInfo = lookup(library, version)
    tree = pristine_tree(info)
    overlay = overlay_for_sdist(tree, test_deps, log=log)
    return mine_tree(info, tree, work_root, uid_base, workers, limit, timeout_s, per_test_timeout_s, log,
                     levels=levels, overlay=overlay, max_per_level=max_per_level, progress=progress)


def _select(cands: list[Candidate], contexts: dict[str, dict[int, set[str]]], stable: set[str],
            dropped: dict) -> list[Candidate]:
    """Candidates whose stubbed lines some stable test runs, none of the body at import, no duplicates."""
    kept: list[Candidate] = []
    seen: set[tuple[str, str, str]] = set()
    for c in cands:
        lines = contexts.get(c.module_path, {})
        in_body = [lines[n] for n in range(c.fn_start, c.fn_end + 1) if n in lines]
        in_span = [lines[n] for n in range(c.start, c.end + 1) if n in lines]
        tests = set().union(*in_span) if in_span else set()
        reason = None
        if c.level == "body" and c.end - c.start + 1 < MIN_BODY_LINES:
            reason = "trivial"
        elif any("" in t for t in in_body):
            reason = "runs_at_import"
        elif c.key in seen:
            reason = "duplicate"
        elif not tests & stable:
            reason = "untested"
        if reason:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        seen.add(c.key)
        c.tests = tests & stable
        kept.append(c)
    return kept


def _load_progress(progress: Path | None, stable_id: str) -> dict[str, Task | None]:
    """Probe results a killed run left (same stable test set only): key -> task or None."""
    out: dict[str, Task | None] = {}
    if progress is None or not progress.is_file():
        return out
    for line in progress.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue   # the line being written when the run was killed
        if rec.get("stable") == stable_id:
            out[rec["key"]] = Task.from_json(rec["task"]) if rec["task"] else None
    return out


def _reference_passes(sb: Sandbox, c: Candidate, original: str, test_command: list[str], f2p: list[str],
                      timeout_s: float, per_test_timeout_s: float) -> bool:
    """The FAIL_TO_PASS tests pass on the original code with the function as the verifier's
    target (its audit hook on): what the reward will hold the reference body to. Loader or
    import machinery, for one, does what the hook refuses, and is no task."""
    fn = find_function(ast.parse(original), c.qualname)
    if fn is None:
        return False
    run = run_tests(sb, test_command, nodeids=f2p, timeout_s=timeout_s, per_test_timeout_s=per_test_timeout_s,
                    target=(f"{INSIDE_REPO}/{c.module_path}", *function_lines(fn)), allow=audit_allowances(fn))
    return (run.finished and not run.refused and not run.tampered
            and all(run.outcomes.get(t) == "passed" for t in f2p))


def _spread(items: list, n: int) -> list:
    """n items taken at even strides (all of them when there are no more than n)."""
    if len(items) <= n:
        return items
    return [items[i * len(items) // n] for i in range(n)]


@dataclass
class _Baseline:
    """What the unmodified suite says: the tests every probe is measured against."""
    stable: set[str]            # passing on both baseline runs
    broken: set[str]            # test files that never collect (their tests are no one's)
    probe_timeout_s: float      # a probe's budget: a few baselines, not the whole timeout


def _baseline(sb: Sandbox, test_command: list[str], library: str, label: str, timeout_s: float,
              per_test_timeout_s: float, report: MiningReport, log: Callable[[str], None]) -> _Baseline:
    """Two runs of the untouched suite. Appends --continue-on-collection-errors to test_command
    when some test file does not collect (else pytest would run no test at all)."""
    t_base = time.monotonic()
    runs = [run_tests(sb, test_command, timeout_s=timeout_s, per_test_timeout_s=per_test_timeout_s,
                      extra_args=["--continue-on-collection-errors"]) for _ in range(2)]
    # a stub or mutant that makes the suite hang (a flipped loop condition) is no task: a probe
    # gets a few times the baseline's wall time, not timeout_s (476 tests x 10 s per test)
    probe_timeout_s = min(timeout_s, max(PROBE_MIN_S, PROBE_FACTOR * (time.monotonic() - t_base) / 2))
    for r in runs:
        if not r.finished or r.tampered:
            raise RuntimeError(f"{library}: baseline test run failed:\n{r.output[-3000:]}")
        if not r.outcomes:
            raise RuntimeError(baseline_error(library, r))
    broken = set(runs[0].collect_errors)
    if broken:
        miss = missing_modules(runs[0])
        log(f"[mine] warning: {len(broken)} test file(s) do not collect: {', '.join(sorted(broken)[:8])}"
            + (f"; they import modules the sandbox Python lacks: {', '.join(miss)} ({_add_hint(library, miss)})"
               if miss else "") + "; mining the tests that do collect")
        test_command.append("--continue-on-collection-errors")
    stable = runs[0].passed & runs[1].passed
    report.stable_tests = len(stable)
    report.flaky_tests = len(runs[0].passed ^ runs[1].passed)
    log(f"[mine] {label}: {len(stable)} stable passing tests, {report.flaky_tests} flaky, "
        f"{len(runs[0].outcomes) - len(runs[0].passed)} not passing")
    return _Baseline(stable, broken, probe_timeout_s)


def _choose(cands: list[Candidate], contexts: dict[str, dict[int, set[str]]], stable: set[str],
            report: MiningReport, levels: tuple[str, ...], max_per_level: int | None,
            limit: int | None) -> list[Candidate]:
    """The candidates worth probing: covered by stable tests, spread evenly over the library when
    capped per level (not its first modules), at most `limit`."""
    report.functions = len({(c.module_path, c.qualname) for c in cands})
    kept = _select(cands, contexts, stable, report.dropped)
    verified = len(kept)
    if max_per_level is not None:
        kept = [c for lv in levels for c in _spread([c for c in kept if c.level == lv], max_per_level)]
    if limit is not None:
        kept = kept[:limit]
    if len(kept) < verified:
        report.dropped["not_probed_over_limit"] = verified - len(kept)
    return kept


@dataclass
class _Prober:
    """One stub per call: stub written, suite run, FAIL_TO_PASS read, the checks that make it a
    task. Probe i runs in workspace i % len(spaces); results go to the progress file as they come."""
    info: SdistInfo
    tree: Path
    src_root: str
    spaces: list[tuple[QuotaDir, Path, Sandbox]]
    test_command: list[str]
    base: _Baseline
    timeout_s: float
    per_test_timeout_s: float
    overlay: Overlay | None
    progress: Path | None
    total: int
    log: Callable[[str], None]
    t0: float
    stable_id: str = ""
    resumed: dict[str, Task | None] = field(default_factory=dict)
    done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, i: int, c: Candidate) -> Task | None:
        key = f"{c.module_path}:{c.qualname}:{c.level}:{c.start}-{c.end}"
        if key in self.resumed:
            return self.resumed[key]
        task = self._verify(i, c)
        if self.progress is not None:
            with self.lock, open(self.progress, "a") as f:
                f.write(json.dumps({"key": key, "stable": self.stable_id,
                                    "task": task and json.loads(task.to_json())}) + "\n")
        return task

    def _run(self, sb: Sandbox, nodeids=()):
        return run_tests(sb, self.test_command, nodeids=nodeids, timeout_s=self.base.probe_timeout_s,
                         per_test_timeout_s=self.per_test_timeout_s)

    def _verify(self, i: int, c: Candidate) -> Task | None:
        _, co, sb = self.spaces[i % len(self.spaces)]
        module = co / c.module_path
        original = (self.tree / c.module_path).read_text()
        lines = original.splitlines(keepends=True)
        stub = stub_for(c)
        module.write_text("".join(lines[:c.start - 1]) + stub + "".join(lines[c.end:]))
        try:
            run = self._run(sb)
        finally:
            module.write_text(original)
            with self.lock:
                self.done += 1
                if self.done % 25 == 0:
                    self.log(f"[mine] probed {self.done}/{self.total} stubs, {time.monotonic() - self.t0:.0f}s")
        stable = self.base.stable
        if set(run.collect_errors) - self.base.broken or not run.finished:
            return None
        f2p = sorted(t for t in stable if run.outcomes.get(t) != "passed")
        if not f2p or len(f2p) > MAX_F2P_FRACTION * len(stable):
            return None
        hole_fails = None
        if c.level == "mutation" and not shows_expected_actual(run.output):
            return None          # the failures must say what the line computes wrong, not only that it raised
        if c.level not in ("body", "mutation"):   # deleting the marked hole must not be a solution
            module.write_text("".join(lines[:c.start - 1]) + f"{c.indent}pass\n" + "".join(lines[c.end:]))
            try:
                run = self._run(sb, nodeids=f2p)
            finally:
                module.write_text(original)
            hole_fails = sum(run.outcomes.get(t) != "passed" for t in f2p)
            if not hole_fails:
                return None
        if not _reference_passes(sb, c, original, self.test_command, f2p, self.timeout_s, self.per_test_timeout_s):
            return None
        return self._task(c, stub, f2p, hole_fails)

    def _task(self, c: Candidate, stub: str, f2p: list[str], hole_fails: int | None) -> Task:
        info, overlay = self.info, self.overlay
        suffix = {"body": "", "mutation": f":mutation@{c.start}"}.get(c.level, f":{c.level}")
        return Task(
            id=f"{info.library}-{info.version}:{c.module_path}:{c.qualname}{suffix}", library=info.library,
            version=info.version, sdist_filename=info.filename, sdist_sha256=info.sha256,
            sdist_url=info.url, module_path=c.module_path, qualname=c.qualname,
            body_start_line=c.start, body_end_line=c.end, original_body=c.body, stub_body=stub,
            fail_to_pass=f2p, pass_to_pass=sorted(self.base.stable - set(f2p)), test_command=self.test_command,
            problem_statement=problem_statement(c, self.src_root), level=c.level,
            test_deps=list(overlay.pins) if overlay else [],
            meta={"candidate_tests": len(c.tests), "body_lines": c.end - c.start + 1,
                  **({"operator": c.operator} if c.operator else {}),
                  "function_lines": c.fn_end - c.fn_start + 1, "f2p_failing_with_hole_deleted": hole_fails,
                  "f2p_outside_coverage": sorted(set(f2p) - c.tests)})


def _probe_all(prober: _Prober, kept: list[Candidate]) -> list[Task]:
    """Each worker owns one workspace, so the probes are split into lanes by workspace."""
    lanes_n = len(prober.spaces)
    lanes = [[(i, c) for i, c in enumerate(kept) if i % lanes_n == w] for w in range(lanes_n)]
    with ThreadPoolExecutor(max_workers=lanes_n) as pool:
        results = list(pool.map(lambda lane: [prober(i, c) for i, c in lane], lanes))
    by_index = {i: t for lane, res in zip(lanes, results) for (i, _), t in zip(lane, res)}
    return [by_index[i] for i in sorted(by_index) if by_index[i] is not None]


def mine_tree(info: SdistInfo, tree: Path, work_root: str | Path = "/tmp/agentic-rlvr-work",
              uid_base: int = 61900, workers: int = 2, limit: int | None = None,
              timeout_s: float = 600.0, per_test_timeout_s: float = 10.0,
              log: Callable[[str], None] = print, levels: tuple[str, ...] = ("body",),
              overlay: Overlay | None = None, max_per_level: int | None = None,
              progress: Path | None = None) -> tuple[list[Task], MiningReport]:
    """mine() on an extracted tree (the sdist's top directory): baseline, coverage, choose, probe,
    the gate's inputs.
    max_per_level: probe at most this many stubs of each level, spread evenly over the candidates
    (large libraries). progress: a JSONL file each probe's result is appended to; a rerun reuses them."""
    t0 = time.monotonic()
    library = info.library
    src_root, packages = find_packages(tree)
    if not packages:
        raise ValueError(f"{info.filename}: no package directory found at the top or under src/")
    cands = candidates(tree, packages, src_root, tuple(levels))
    test_command = list(BASE_PYTEST) + (["-o", f"pythonpath={src_root}"] if src_root else [])
    report = MiningReport(library, info.version)
    root = Path(work_root)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    limits = Limits(cpu_s=int(timeout_s), memory_mib=4096, max_processes=256, max_file_mib=256)
    site = overlay.path if overlay else None

    def workspace(i: int) -> tuple[QuotaDir, Path, Sandbox]:
        q = QuotaDir(root / f"mine-{library}-{uuid.uuid4().hex[:8]}", 1024)
        co = q.path / "repo"
        shutil.copytree(tree, co, symlinks=True)
        chown_tree(co, uid_base + i)
        return q, co, Sandbox(co, uid=uid_base + i, limits=limits, max_output_chars=200_000, site_overlay=site)

    spaces = [workspace(i) for i in range(max(1, workers))]
    try:
        _, co0, sb0 = spaces[0]
        base = _baseline(sb0, test_command, library, info.filename, timeout_s, per_test_timeout_s, report, log)
        contexts = _coverage_contexts(sb0, co0, packages, test_command, timeout_s)
        log(f"[mine] coverage: {sum(len(v) for v in contexts.values())} lines of {len(contexts)} files ran in tests")
        kept = _choose(cands, contexts, base.stable, report, levels, max_per_level, limit)
        log(f"[mine] probing {len(kept)} stubs ({', '.join(f'{lv} {sum(c.level == lv for c in kept)}' for lv in levels)})")
        prober = _Prober(info, tree, src_root, spaces, test_command, base, timeout_s, per_test_timeout_s,
                         overlay, progress, len(kept), log, t0)
        prober.stable_id = hashlib.sha256("\n".join(sorted(base.stable)).encode()).hexdigest()[:16]
        prober.resumed = _load_progress(progress, prober.stable_id)
        if prober.resumed:
            log(f"[mine] resuming: {len(prober.resumed)} stubs already probed ({progress})")
        tasks = _probe_all(prober, kept)
        if tasks:
            annotate(tasks, co0, sb0, timeout_s, per_test_timeout_s, log)
        report.dropped["stub_not_detected_breaks_import_hole_deletable_or_refused"] = len(kept) - len(tasks)
        report.tasks = len(tasks)
        report.levels = {lv: sum(t.level == lv for t in tasks) for lv in levels}
        report.test_deps = list(overlay.pins) if overlay else []
        report.seconds = time.monotonic() - t0
        log(f"[mine] {library} {info.version}: {len(tasks)} tasks {report.levels} from {report.functions} "
            f"functions in {report.seconds:.1f}s; dropped {report.dropped}")
        return tasks, report
    finally:
        for q, _, _ in spaces:
            q.close()
