"""`rlvr calibrate`: pass rates of a policy on a run's training tasks, and the band file."""
from __future__ import annotations

from pathlib import Path

from cli.config_args import DEFAULT_CONFIG, config_from_args


def main(args) -> int:
    cfg = config_from_args(args)
    run_dir = Path(args.run_dir or cfg.trainer.run_dir)
    from orchestrator.calibrate import BAND_FILE, render_band, run_calibration  # heavy: ray, vLLM

    band = run_calibration(cfg, run_dir, args.adapter)
    print(render_band(band))
    print(f"[rlvr calibrate] band file {run_dir / BAND_FILE}; train on it with task.band_file={run_dir / BAND_FILE}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="k episodes per training task -> pass rates -> band file (resumable)")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_CONFIG.name})")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. calibrate.k=8 calibrate.lo=0.1")
    p.add_argument("--run-dir", help="run directory whose split is calibrated (default: trainer.run_dir)")
    p.add_argument("--adapter", help="LoRA adapter folder to serve on top of model.path")
    p.set_defaults(func=main)
