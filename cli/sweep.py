"""`rlvr sweep`: runs of one config that differ in one key (a learning-rate sweep), side by side
on this host, then `rlvr compare` of them.

One Ray holds every arm; each arm is an `rlvr train` joined to it with its share of the GPU (the
config's GPU fractions divided by the number of arms), so a small model's arms share one card and
start their engines once. Run the same command again to continue every arm from its checkpoint
(with --time-limit, a batch job's slices). An arm's config keeps this Ray's address: to resume one
alone, add `ray.address=null`.

    rlvr sweep CONFIG --key learner.lr --values 2e-4 5e-5 1e-5 --out runs/sweep \\
        [--time-limit SECONDS] [key=value ...]
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rl.config import RunConfig, load_config


def arm_shares(cfg: RunConfig, arms: int) -> list[str]:
    """Overrides that give each of `arms` runs its share of one host's GPU."""
    if cfg.rollout.num_gpus <= 0 and cfg.learner.num_gpus <= 0:
        return []
    out = [f"rollout.num_gpus={cfg.rollout.num_gpus / arms:.4g}", f"learner.num_gpus={cfg.learner.num_gpus / arms:.4g}",
           f"learner.gpu_memory_fraction={min(cfg.learner.gpu_memory_fraction, 0.9 / arms):.4g}"]
    # an engine sized by its KV cache still checks that gpu_memory_utilization of the card is free
    out.append(f"rollout.gpu_memory_utilization={min(cfg.rollout.gpu_memory_utilization, 0.9 / (2 * arms)):.4g}")
    return out


def arm_dir(out: Path, key: str, value: str) -> Path:
    return out / f"{key.rsplit('.', 1)[-1]}-{value}"


def arm_command(config: str, overrides: list[str], run: Path, key: str, value: str, address: str,
                shares: list[str], time_limit: float | None) -> list[str]:
    arm = [f"{key}={value}", f"ray.address={address}", *shares]
    if (run / "config.yaml").is_file():
        cmd = ["train", "--resume", str(run), *overrides, *arm]   # e.g. more trainer.steps
    else:
        cmd = ["train", config, *overrides, f"trainer.run_dir={run}", *arm]
    if time_limit:
        cmd += ["--time-limit", f"{time_limit:g}"]
    return [sys.executable, "-m", "cli.main", *cmd]


def main(args) -> int:
    # overrides written after --values land in it: they are the ones with a '='
    args.overrides = [*args.overrides, *(v for v in args.values if "=" in v)]
    args.values = [v for v in args.values if "=" not in v]
    if len(args.values) < 1:
        raise SystemExit("rlvr sweep: --values needs at least one value")
    base = load_config(args.config, [*args.overrides, f"{args.key}={args.values[0]}"])   # a bad key fails here
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shares = arm_shares(base, len(args.values))
    import ray

    from orchestrator.cluster import cpus_needed

    ray.init(num_cpus=max(os.cpu_count() or 1, int(len(args.values) * cpus_needed(base) + 0.999)),
             include_dashboard=False, configure_logging=False)
    address = ray.get_runtime_context().gcs_address
    procs: dict[Path, subprocess.Popen] = {}
    try:
        for value in args.values:
            run = arm_dir(out, args.key, value)
            cmd = arm_command(args.config, args.overrides, run, args.key, value, address, shares, args.time_limit)
            log = open(out / f"{run.name}.log", "ab")
            procs[run] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            print(f"[rlvr sweep] {run.name}: {' '.join(cmd[3:])} (log {out / (run.name + '.log')})", flush=True)
        while any(p.poll() is None for p in procs.values()):
            time.sleep(args.poll_s)
            print("[rlvr sweep] " + " · ".join(f"{run.name}: {_progress(run, p)}" for run, p in procs.items()),
                  flush=True)
    finally:
        for p in procs.values():   # an interrupt reached the arms too: let them record and stop
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                p.kill()
        ray.shutdown()
    failed = {run.name: p.returncode for run, p in procs.items() if p.returncode != 0}
    done = [run for run in procs if (run / "metrics.jsonl").is_file()]
    if len(done) >= 2:
        from orchestrator.run_compare import compare_runs, render
        try:
            print(render(compare_runs(done)))
        except ValueError as e:
            print(f"[rlvr sweep] no comparison yet: {e}")
    if failed:
        print(f"[rlvr sweep] arms that failed (exit code): {failed}; their logs are in {out}", file=sys.stderr)
        return 1
    return 0


def _progress(run: Path, proc: subprocess.Popen) -> str:
    from orchestrator.metrics import read_metrics
    steps = read_metrics(run) if (run / "metrics.jsonl").is_file() else []
    state = "running" if proc.poll() is None else f"exit {proc.returncode}"
    return f"{len(steps)} step(s), {state}"


def register(sub) -> None:
    p = sub.add_parser("sweep", help="runs differing in one key, side by side on this host, then compared")
    p.add_argument("config", help="run config YAML")
    p.add_argument("overrides", nargs="*", help="dotted overrides for every arm")
    p.add_argument("--key", required=True, help="the dotted key the arms differ in, e.g. learner.lr")
    p.add_argument("--values", nargs="+", required=True, help="one arm per value; the first is the baseline")
    p.add_argument("--out", required=True, help="the arms' run directories go here (<key>-<value>)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS", help="each arm's --time-limit")
    p.add_argument("--poll-s", type=float, default=60.0, help="seconds between progress lines")
    p.set_defaults(func=main)
