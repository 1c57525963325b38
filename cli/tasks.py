"""`rlvr tasks ...`: mine task files from PyPI sdists, inspect them, write a run's split."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from envs.gate import annotate_files, coverage
from envs.mining import mine
from envs.split import write_split
from envs.tasks import LEVELS, load_tasks, save_tasks
from rl.paths import DEFAULT_WORK_ROOT


def register(subparsers) -> None:
    p = subparsers.add_parser("tasks", help="mine and manage coding tasks")
    sub = p.add_subparsers(dest="tasks_command", required=True)

    m = sub.add_parser("mine", help="mine stub-a-function tasks from a library's sdist (sandboxed)")
    m.add_argument("library", help="PyPI name, e.g. toolz")
    m.add_argument("--version", default=None, help="default: latest")
    m.add_argument("--out", default=None, help="JSONL path (default: configs/tasks/<library>.jsonl)")
    m.add_argument("--limit", type=int, default=None, help="probe at most this many functions")
    m.add_argument("--workers", type=int, default=2)
    m.add_argument("--work-root", default=DEFAULT_WORK_ROOT)
    m.add_argument("--uid-base", type=int, default=61900,
                   help="sandbox uids of the workers (uid-base + i): a range no other sandbox on the host uses")
    m.add_argument("--levels", default="body",
                   help=f"comma-separated difficulty levels, or 'all' ({', '.join(LEVELS)}; default: body)")
    m.add_argument("--max-per-level", type=int, default=None,
                   help="probe at most this many stubs per level, spread over the library (large libraries)")
    m.add_argument("--test-deps", nargs="+", default=[], metavar="REQ",
                   help="test-only requirements the library does not declare (e.g. freezegun); installed "
                        "with its declared ones into a read-only overlay of the sandbox Python")
    m.set_defaults(func=_mine)

    s = sub.add_parser("split", help="write a run's train/test split (once; refuses a different one)")
    s.add_argument("tasks_file")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--train-fraction", type=float, default=0.8)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_split)

    g = sub.add_parser("merge", help="one task file from several (e.g. levels and mutations of four libraries)")
    g.add_argument("out")
    g.add_argument("inputs", nargs="+")
    g.set_defaults(func=_merge)

    d = sub.add_parser("gate", help="record the differential gate's inputs of task files, in place (sandboxed)")
    d.add_argument("tasks_files", nargs="+")
    d.add_argument("--work-root", default=DEFAULT_WORK_ROOT)
    d.add_argument("--uid", type=int, default=61900, help="the sandbox uid of the recording runs")
    d.set_defaults(func=_gate)

    i = sub.add_parser("info", help="summarize a task file")
    i.add_argument("tasks_file")
    i.set_defaults(func=_info)


def _mine(args: argparse.Namespace) -> int:
    out = Path(args.out or f"configs/tasks/{args.library}.jsonl")
    levels = LEVELS if args.levels == "all" else tuple(v.strip() for v in args.levels.split(",") if v.strip())
    bad = sorted(set(levels) - set(LEVELS))
    if bad or not levels:
        print(f"error: unknown level(s) {bad}; choose from {', '.join(LEVELS)} or 'all'")
        return 2
    progress = out.with_suffix(".progress.jsonl")   # a killed run resumes from it
    tasks, report = mine(args.library, args.version, work_root=args.work_root, uid_base=args.uid_base,
                         workers=args.workers,
                         limit=args.limit, levels=levels, test_deps=tuple(args.test_deps),
                         max_per_level=args.max_per_level, progress=progress)
    save_tasks(tasks, out)
    progress.unlink(missing_ok=True)
    out.with_suffix(".report.json").write_text(json.dumps(asdict(report), indent=1))
    print(f"wrote {len(tasks)} tasks to {out}")
    return 0 if tasks else 1


def _merge(args: argparse.Namespace) -> int:
    """Concatenate task files; a task id in two of them is an error (load_tasks says where)."""
    tasks = [t for path in args.inputs for t in load_tasks(path)]
    ids = [t.id for t in tasks]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        print(f"error: {len(twice)} task id(s) occur in more than one input, e.g. {twice[0]}")
        return 2
    save_tasks(tasks, Path(args.out))
    print(f"wrote {len(tasks)} tasks from {len(args.inputs)} files to {args.out}")
    return 0


def _split(args: argparse.Namespace) -> int:
    split = write_split(args.run_dir, load_tasks(args.tasks_file), args.train_fraction, args.seed)
    print(f"{args.run_dir}/split.json: {len(split.train)} train, {len(split.test)} test")
    return 0


def _gate(args: argparse.Namespace) -> int:
    summary = annotate_files([Path(p) for p in args.tasks_files], Path(args.work_root), args.uid)
    for path, cov in summary.items():
        print(f"{path}: {cov['with_inputs']} of {cov['tasks']} tasks have gate inputs "
              f"(recorded median {cov['recorded_median']}, perturbed median {cov['perturbed_median']})")
    return 0


def _info(args: argparse.Namespace) -> int:
    tasks = load_tasks(args.tasks_file)
    f2p = [len(t.fail_to_pass) for t in tasks]
    levels = {lv: sum(t.level == lv for t in tasks) for lv in LEVELS if any(t.level == lv for t in tasks)}
    print(f"{len(tasks)} tasks; libraries {sorted({t.library for t in tasks})}; levels {levels}; "
          f"FAIL_TO_PASS per task min {min(f2p, default=0)} max {max(f2p, default=0)}")
    cov = coverage(tasks)
    print(f"differential gate: {cov['with_inputs']} tasks with recorded inputs (median {cov['recorded_median']} "
          f"recorded, {cov['perturbed_median']} perturbed), {cov['tasks'] - cov['annotated']} not annotated")
    return 0
