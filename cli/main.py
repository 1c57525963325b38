"""`rlvr` console command: one parser, one handler per subcommand module, and the one
place a config error (exit 2) or an interrupt (exit 130: Ctrl-C, or a batch job's time limit
sent as SIGINT) becomes a clean message instead of a traceback."""
from __future__ import annotations

import argparse
import sys

from cli import (
    best_of_n,
    calibrate,
    compare,
    doctor,
    evaluate,
    harvest,
    model,
    monitor,
    pack,
    sweep,
    tasks,
    train,
    warm_start,
)
from rl.config import ConfigError

SUBCOMMANDS = (train, warm_start, harvest, calibrate, model, tasks, evaluate, best_of_n, monitor, doctor, pack,
               compare, sweep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlvr", description="Execution-reward GRPO for coding agents")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.register(sub)
    # Overrides may follow options (`rlvr train cfg.yaml --run-dir x a.b=1`); argparse alone
    # would reject them, since the positional list ended at the first option.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = [*(args.overrides or []), *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"rlvr {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # every long command records as it goes: say so, and how to go on
        again = "rlvr train --resume RUN_DIR" if args.command == "train" else "the same command"
        print(f"rlvr {args.command}: interrupted; the episodes and checkpoints finished so far are kept: "
              f"{again} continues from them", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
