"""`rlvr train`: one entry point for embedded runs and `ray job submit` alike."""
from __future__ import annotations

import time
from pathlib import Path

from cli.config_args import DEFAULT_CONFIG, config_from_args
from rl.config import load_config


def run_config(args):
    """(config, run dir) of `rlvr train`: a new run's config and overrides, or with --resume the
    run's own config.yaml plus overrides (`--resume RUN key=value`)."""
    if not args.resume:
        cfg = config_from_args(args)
        run_dir = Path(cfg.trainer.run_dir)
        if (run_dir / "config.yaml").exists():
            raise SystemExit(f"{run_dir} already holds a run: resume it with `rlvr train --resume {run_dir}`, "
                             f"delete it, or choose another trainer.run_dir=...")
        return cfg, run_dir
    run_dir = Path(args.resume)
    if not (run_dir / "config.yaml").is_file():
        raise SystemExit(f"--resume {run_dir}: not a run directory (no config.yaml in it)")
    overrides = list(args.overrides)
    if args.config and "=" in args.config and not Path(args.config).exists():
        overrides.insert(0, args.config)   # the first override landed in the `config` positional
    elif args.config:
        raise SystemExit(f"--resume {run_dir} uses the run's own config.yaml; give overrides only, not "
                         f"{args.config}")
    return load_config(run_dir / "config.yaml", overrides), run_dir


def train(args) -> int:
    started = time.time()
    cfg, run_dir = run_config(args)
    from cli.doctor import start_preflight
    from orchestrator.cluster import ActorLost
    from orchestrator.pipeline import run_pipeline  # heavy (ray, torch): after the config, before preflight
    preflight = start_preflight(cfg)  # waited on before any actor starts: a missing sandbox or model fails there
    deadline = started + args.time_limit if args.time_limit else None
    try:
        run_pipeline(cfg, run_dir, resume=bool(args.resume), preflight=preflight, deadline=deadline)
    except ActorLost as e:  # a dead node or a memory kill: the one line says it all, a traceback would bury it
        raise SystemExit(f"[rlvr] {e}") from None
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="run GRPO training (embedded Ray, or the cluster under `ray job submit`)")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_CONFIG.name})")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.steps=20 rollout.temperature=0.8")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="start no GRPO step that would end later than this after launch (a batch job's limit): "
                        "the run stops at a step boundary, checkpointed, and continues with --resume")
    p.set_defaults(func=train)
