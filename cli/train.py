"""`rlvr train`: one entry point for embedded runs and `ray job submit` alike."""
from __future__ import annotations

import sys
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
    cfg, run_dir = run_config(args)
    from cli.doctor import start_preflight
    from orchestrator.console import actor_log_tails
    from orchestrator.loop import Trainer  # heavy (ray, torch): once the config is good, before the preflight thread
    preflight = start_preflight(cfg)  # waited on before any actor starts: a missing sandbox or model fails there
    if (cfg.warm_start.enabled or cfg.calibrate.enabled) and not args.resume:
        preflight()                   # those stages start actors of their own
    if cfg.warm_start.enabled and not args.resume:
        from orchestrator.warm_start import run_warm_start  # reuses a finished warm-start folder

        cfg.model.path = str(run_warm_start(cfg, run_dir))
        print(f"[rlvr] GRPO starts from the warm-started model {cfg.model.path}", flush=True)
    if cfg.calibrate.enabled and not args.resume and not cfg.task.band_file:
        import ray

        from orchestrator.calibrate import BAND_FILE, render_band, run_calibration

        band = run_calibration(cfg, run_dir)   # resumable: reruns only what is missing
        print(render_band(band), flush=True)
        ray.shutdown()   # its engine and env actors go; training places its own
        if not band["tasks"]:
            raise SystemExit(f"[rlvr] calibration found no task with a {band['by']} in [{band['lo']}, {band['hi']}] "
                             f"(mean pass rate {band['mean_pass_rate']:.3f} over {band['calibrated']} tasks; records "
                             f"in {run_dir / 'calibration'}): GRPO would get no learning signal. Warm-start the "
                             "policy further, widen calibrate.lo / calibrate.hi, or calibrate easier tasks "
                             "(task.levels)")
        cfg.task.band_file = str(run_dir / BAND_FILE)
        print(f"[rlvr] GRPO trains on the band {cfg.task.band_file}", flush=True)
    try:
        Trainer(cfg, run_dir, before_actors=preflight).run()
    except Exception:
        tails = actor_log_tails(run_dir)  # the actors' output stays in files unless the run fails
        if tails and cfg.logging.console != "debug":
            print(f"[rlvr] the run failed; the actors' logs end with:\n{tails}", file=sys.stderr, flush=True)
        raise
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="run GRPO training (embedded Ray, or the cluster under `ray job submit`)")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_CONFIG.name})")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.steps=20 rollout.temperature=0.8")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.set_defaults(func=train)
