"""`rlvr` console command. Each subcommand lives with the code it drives."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module exposing `register(subparsers)`; imported lazily so `rlvr --help` is fast
SUBCOMMAND_MODULES = ["rl.train_cli", "rl.default_model", "envs.cli", "scaffolds.cli"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlvr", description="Execution-reward GRPO for coding agents")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that part of the project is not there yet
                continue
            raise
        module.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
