"""The stages of a run, in order: warm-start (SFT) -> calibrate (pick the task band) -> GRPO.

One place for the order and the hand-offs: warm-start gives GRPO its starting model, calibration
its band file. A resumed run skips the first two (its config already names what they made)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator.console import actor_log_tails
from orchestrator.loop import Trainer
from rl.config import RunConfig


def warm_start_stage(cfg: RunConfig, run_dir: Path) -> None:
    from orchestrator.warm_start import run_warm_start  # reuses a finished warm-start folder

    cfg.model.path = str(run_warm_start(cfg, run_dir))
    print(f"[rlvr] GRPO starts from the warm-started model {cfg.model.path}", flush=True)


def calibrate_stage(cfg: RunConfig, run_dir: Path) -> None:
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


def grpo_stage(cfg: RunConfig, run_dir: Path, before_actors: Callable[[], None],
               deadline: float | None = None) -> None:
    try:
        Trainer(cfg, run_dir, before_actors=before_actors, deadline=deadline).run()
    except Exception:
        tails = actor_log_tails(run_dir)   # the actors' output stays in files unless the run fails
        if tails and cfg.logging.console != "debug":
            print(f"[rlvr] the run failed; the actors' logs end with:\n{tails}", file=sys.stderr, flush=True)
        raise


def run_pipeline(cfg: RunConfig, run_dir: Path, resume: bool, preflight: Callable[[], None],
                 deadline: float | None = None) -> None:
    """preflight: the environment checks (started by the caller, waited on here before the first
    stage that starts actors); deadline: no GRPO step starts that would end after it."""
    if (cfg.warm_start.enabled or cfg.calibrate.enabled) and not resume:
        preflight()                   # those stages start actors of their own
    if cfg.warm_start.enabled and not resume:
        warm_start_stage(cfg, run_dir)
    if cfg.calibrate.enabled and not resume and not cfg.task.band_file:
        calibrate_stage(cfg, run_dir)
    grpo_stage(cfg, run_dir, preflight, deadline)
