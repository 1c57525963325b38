"""`rlvr compare RUN_DIR...`: runs side by side (a sweep's arms), the first named as the baseline."""
from __future__ import annotations

import json
from pathlib import Path


def main(args) -> int:
    from orchestrator.run_compare import compare_runs, plot_runs, render

    dirs = [Path(d) for d in args.run_dirs]
    missing = [str(d) for d in dirs if not (d / "metrics.jsonl").is_file() or not (d / "config.yaml").is_file()]
    if missing:
        raise SystemExit(f"rlvr compare: no metrics.jsonl and config.yaml in {', '.join(missing)}")
    try:
        result = compare_runs(dirs, args.first_last)
    except ValueError as e:
        raise SystemExit(f"rlvr compare: {e}") from e
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.png:
        print(f"plot: {plot_runs(result, args.png)}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("compare", help="runs side by side: band reward over their shared steps, paired per step")
    p.add_argument("run_dirs", nargs="+", help="run directories; the first is the baseline of the paired difference")
    p.add_argument("--first-last", type=int, default=3, help="steps averaged at each end (default 3)")
    p.add_argument("--json", help="write the comparison as JSON here")
    p.add_argument("--png", help="plot the band reward per step of each run here")
    p.set_defaults(func=main)
