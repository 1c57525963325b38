"""Calibration: k episodes per training task with a given policy through the deployment
scaffold, per-task pass rates, and the band of tasks worth training on.

The episodes are run by the Evaluator (one durable record per episode, resumable: a killed
calibration re-runs only the episodes without a record) into <run_dir>/calibration/. The
tasks are the training side of the run's split (split.json, written here if the run has
none yet), so calibration never runs a held-out task. The band file lists the tasks whose
pass rate lies in [calibrate.lo, calibrate.hi]; `task.band_file` points training at it.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from envs.split import select_tasks, spread, write_band
from orchestrator.eval_report import RECORDS_FILE, load_records, passed
from orchestrator.plots import plot_pass_rates
from rl.config import RunConfig
from rl.passk import pass_at_k

CALIBRATION_DIR = "calibration"
BAND_FILE = "band.json"


def calibration_tasks(cfg: RunConfig, run_dir: str | Path) -> list:
    """The training side of the run's split (never narrowed by an earlier band); max_tasks of them
    spread over the library's files."""
    task_cfg = cfg.task.model_copy(update={"band_file": None})
    tasks = select_tasks(task_cfg, cfg.trainer.seed, run_dir, "train")
    return spread(tasks, cfg.calibrate.max_tasks, cfg.trainer.seed)


def band_from_records(records: list[dict], task_ids: list[str], k: int, lo: float, hi: float,
                      by: str = "pass_rate") -> dict:
    """Per-task pass rate, mean reward and unbiased pass@k, and the band [lo, hi] of `by`:
    pass_rate, or mean_reward for tasks whose k rewards are not all equal (partial credit: a
    task can give GRPO a signal before any of its episodes passes).

    A task with fewer than k finished episodes is listed as incomplete and left out of the band.
    """
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    per_task, incomplete = {}, []
    for tid in task_ids:
        rs = by_task.get(tid, [])
        if len(rs) < k:
            incomplete.append(tid)
            continue
        n, c = len(rs), sum(passed(r) for r in rs)
        rewards = [float(r["reward"]) for r in rs]
        per_task[tid] = {"n": n, "passes": c, "pass_rate": c / n, "mean_reward": sum(rewards) / n,
                         "rewards_differ": max(rewards) > min(rewards), f"pass@{k}": pass_at_k(n, c, k)}
    if by == "pass_rate":
        band = [tid for tid, t in per_task.items() if lo <= t["pass_rate"] <= hi]
    else:
        band = [tid for tid, t in per_task.items() if lo <= t["mean_reward"] <= hi and t["rewards_differ"]]
    rates = [t["pass_rate"] for t in per_task.values()]
    return {"tasks": band, "by": by, "lo": lo, "hi": hi, "k": k, "calibrated": len(per_task), "incomplete": incomplete,
            "mean_pass_rate": sum(rates) / len(rates) if rates else 0.0, "per_task": per_task}


def run_calibration(cfg: RunConfig, run_dir: str | Path, adapter: str | None = None) -> dict:
    """Run what is missing, write <run_dir>/band.json, return the band."""
    import ray

    from orchestrator.cluster import run_evaluator, spawn_env_actors, start_policy

    run_dir = Path(run_dir)
    c = cfg.calibrate
    tasks = calibration_tasks(cfg, run_dir)
    ecfg = cfg.model_copy(deep=True)  # the Evaluator runs the episodes: calibration's k, scaffold, parallelism
    ecfg.eval.k, ecfg.eval.scaffold, ecfg.eval.parallel = c.k, c.scaffold, c.parallel
    out = run_dir / CALIBRATION_DIR
    print(f"[rlvr calibrate] {len(tasks)} training tasks x k={c.k} through {c.scaffold}; records in {out}",
          flush=True)
    worker, base_url = start_policy(ecfg, adapter)
    env_actors = spawn_env_actors(ecfg)
    try:
        run_evaluator(ecfg, str(out), tasks, base_url, ecfg.eval.model_id, env_actors, worker)
    finally:
        ray.get([a.shutdown.remote() for a in env_actors])
        ray.get(worker.shutdown.remote())
    band = band_from_records(load_records(out / RECORDS_FILE), [t.id for t in tasks], c.k, c.lo, c.hi, c.band_by)
    band["policy"] = {"model_path": cfg.model.path, "adapter": adapter, "scaffold": c.scaffold}
    band["levels"] = {t.id: t.level for t in tasks}
    write_band(run_dir / BAND_FILE, band)
    if band["per_task"]:
        plot_pass_rates(band, out / "pass_rates.png")
    return band


def render_band(band: dict) -> str:
    lines = [f"calibrated {band['calibrated']} task(s) at k={band['k']}: mean pass rate "
             f"{band['mean_pass_rate']:.3f}; band ({band.get('by', 'pass_rate')} in [{band['lo']}, {band['hi']}]) "
             f"holds {len(band['tasks'])}",
             "", "| task | pass rate | mean reward | pass@k | in band |", "|---|---|---|---|---|"]
    key = f"pass@{band['k']}"
    for tid, t in band["per_task"].items():
        lines.append(f"| {tid} | {t['pass_rate']:.2f} | {t['mean_reward']:.3f} | {t[key]:.2f} | "
                     f"{'yes' if tid in band['tasks'] else ''} |")
    levels, by_level = band.get("levels", {}), defaultdict(list)
    for tid, t in band["per_task"].items():
        by_level[levels.get(tid, "?")].append(t["pass_rate"])
    if len(by_level) > 1 or "?" not in by_level:
        lines += ["", "| level | tasks | mean pass rate | in band |", "|---|---|---|---|"]
        for name, rates in sorted(by_level.items()):
            inside = sum(1 for tid in band["tasks"] if levels.get(tid, "?") == name)
            lines.append(f"| {name} | {len(rates)} | {sum(rates) / len(rates):.2f} | {inside} |")
    if band["incomplete"]:
        lines.append(f"\nincomplete (fewer than k episodes): {len(band['incomplete'])}")
    return "\n".join(lines)
