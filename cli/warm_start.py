"""`rlvr warm-start`: execution-verified demonstrations for a run's training split, then SFT
into a merged model folder that a GRPO config points at (`model.path`). `rlvr train` runs the
same stage first when `warm_start.enabled` is set."""
from __future__ import annotations

from pathlib import Path

from cli.config_args import DEFAULT_CONFIG, config_from_args


def main(args) -> int:
    cfg = config_from_args(args)
    run_dir = Path(args.run_dir or cfg.trainer.run_dir)
    from orchestrator.warm_start import run_warm_start  # heavy: only once the config is good

    out = run_warm_start(cfg, run_dir, demos_only=args.demos_only)
    if args.demos_only:
        print(f"demonstrations: {out}")
        return 0
    print(f"warm-started model: {out}\nstart GRPO from it with: model.path={out}")
    if args.ship:
        from orchestrator.warm_start import ship

        command = " ".join(["rlvr warm-start", *([args.config] if args.config else []), *(args.overrides or []),
                            *(["--run-dir", args.run_dir] if args.run_dir else [])])
        dest = ship(cfg, run_dir, Path(args.ship), command, [Path(d) for d in args.heldout])
        print(f"shipped: {dest} (model.path={dest})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("warm-start", help="demonstrations for the training split, then SFT into a merged model")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_CONFIG.name})")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. warm_start.epochs=1")
    p.add_argument("--run-dir", help="run directory whose split is used (default: trainer.run_dir)")
    p.add_argument("--demos-only", action="store_true", help="build the demonstrations and their tokenized rows, "
                                                              "and stop (SFT them later, e.g. on a CUDA host)")
    p.add_argument("--ship", metavar="DEST", help="copy the trained adapter to DEST with a manifest (demo set hash, "
                                                  "SFT settings and figures, this command): a folder model.path names")
    p.add_argument("--heldout", action="append", default=[], metavar="EVAL_DIR",
                   help="with --ship: a held-out `rlvr eval --out` folder of this warm-start whose figures the "
                        "manifest keeps (repeatable)")
    p.set_defaults(func=main)
