"""`rlvr doctor`: the preflight table for this host and a config, each failure with its fix.

`rlvr train` runs the same checks (all but the GPU kernel agreement run) before it starts
any actor, and stops on a failure."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from cli.config_args import DEFAULT_CONFIG, config_from_args


def doctor(args) -> int:
    from orchestrator.preflight import failures, format_table, run_checks

    cfg = config_from_args(args)
    checks = run_checks(cfg, full=args.full)
    print(format_table(checks))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([asdict(c) for c in checks], indent=1))
    bad = failures(checks)
    if bad:
        print(f"rlvr doctor: {len(bad)} check(s) failed", file=sys.stderr)
    return 1 if bad else 0


def start_preflight(cfg) -> Callable[[], None]:
    """Start the cheap checks in a thread (files, a tokenizer, `pi --version`; no Ray) and return
    the wait: Ray starts while they run (~3 s of start-up each), and the wait stops with the table
    on a failure before any actor is placed."""
    from orchestrator.preflight import failures, format_table, run_checks

    pending = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight").submit(run_checks, cfg, full=False)

    def wait() -> None:
        checks = pending.result()
        if failures(checks):
            raise SystemExit(f"rlvr train: preflight failed (see `rlvr doctor`):\n{format_table(checks)}")
    return wait


def register(sub) -> None:
    p = sub.add_parser("doctor", help="preflight table: GPU, versions vs the locks, kernels, sandbox, pi, model, memory")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_CONFIG.name})")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.path=/models/Qwen3.5-4B")
    p.add_argument("--full", action="store_true", help="also run the GPU kernel agreement check (seconds)")
    p.add_argument("--json", metavar="PATH", help="also write the checks as JSON")
    p.set_defaults(func=doctor)
