"""Runs side by side (a learning-rate sweep, an ablation): the band's reward over the steps every
run has, first steps against last, the paired per-step difference from the first run, and the
step's diagnostics. Arms of one sweep share the band and the seed, so step t draws the same
tasks in every arm and the per-step difference is paired."""
from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from orchestrator.metrics import first_last_change, read_metrics

REWARD = "band/reward_mean"


def _mean(vals: list[float]) -> float | None:
    vals = [v for v in vals if isinstance(v, (int, float))]
    return statistics.fmean(vals) if vals else None


def _se(vals: list[float]) -> float:
    return (statistics.variance(vals) / len(vals)) ** 0.5 if len(vals) > 1 else float("nan")


def run_summary(run_dir: Path, steps: list[int], n: int) -> dict:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    recs = {r["step"]: r for r in read_metrics(run_dir)}
    common = [recs[s] for s in steps]
    band = [r[REWARD] for r in common]
    change = first_last_change(band, n)
    group = cfg["trainer"]["group_size"]
    episodes = sum(r.get("sampling/groups_sampled", 0) * group for r in common)
    seconds = sum(r.get("time_step_s", 0.0) for r in common)
    return {
        "run": run_dir.name, "lr": cfg["learner"]["lr"], "steps_logged": len(recs),
        "band_reward_mean": _mean(band),
        "first_n": _mean(band[:n]), "last_n": _mean(band[-n:]),
        "last_minus_first": change[2] - change[1] if change else None,
        "last_minus_first_se": change[3] if change else None,
        "frac_reward_zero_std": _mean([r.get("frac_reward_zero_std") for r in common]),
        "entropy_first": common[0].get("policy/entropy") if common else None,
        "entropy_last": common[-1].get("policy/entropy") if common else None,
        "tis_capped_frac": _mean([r.get("learner/tis_capped_frac") for r in common]),
        "parity_gap": _mean([r.get("parity_gap") for r in common]),
        "step_s": seconds / len(common) if common else None,
        "episodes_per_s": episodes / seconds if seconds else None,
        "band": band,
    }


def compare_runs(run_dirs: list[Path], n: int = 3) -> dict:
    """Summaries over the steps all runs logged, and each run's paired difference from the first."""
    logged = [{r["step"] for r in read_metrics(d) if isinstance(r.get(REWARD), (int, float))} for d in run_dirs]
    steps = sorted(set.intersection(*logged)) if logged else []
    if not steps:
        raise ValueError(f"the runs share no logged step with a {REWARD} ({', '.join(map(str, run_dirs))})")
    n = max(1, min(n, len(steps) // 2))  # first_last_change needs 2 a side; the means alone take 1
    rows = [run_summary(Path(d), steps, n) for d in run_dirs]
    base = rows[0]["band"]
    for row in rows:
        diffs = [b - a for a, b in zip(base, row["band"])]
        row["paired_diff"], row["paired_diff_se"] = statistics.fmean(diffs), _se(diffs)
    return {"steps": steps, "n": n, "runs": rows}


def render(result: dict) -> str:
    n, rows = result["n"], result["runs"]
    f = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"   # noqa: E731
    head = (f"{'run':<14} {'lr':>8} {'band':>6} {'first' + str(n):>7} {'last' + str(n):>7} {'change':>15} "
            f"{'vs ' + rows[0]['run']:>16} {'0-std':>6} {'entropy':>13} {'capped':>7} {'parity':>7} "
            f"{'step s':>7} {'ep/s':>5}")
    lines = [f"steps {result['steps'][0]}..{result['steps'][-1]} ({len(result['steps'])} shared by every run); "
             f"band reward per step, first {n} against last {n} (+- s.e. from the steps' spread)", head]
    for r in rows:
        change = "-" if r["last_minus_first"] is None else f"{r['last_minus_first']:+.3f}+-{r['last_minus_first_se']:.3f}"
        paired = f"{r['paired_diff']:+.3f}+-{r['paired_diff_se']:.3f}" if r is not rows[0] else "-"
        ent = f"{f(r['entropy_first'], 2)}->{f(r['entropy_last'], 2)}"
        lines.append(f"{r['run']:<14} {r['lr']:>8.0e} {f(r['band_reward_mean']):>6} {f(r['first_n']):>7} "
                     f"{f(r['last_n']):>7} {change:>15} {paired:>16} {f(r['frac_reward_zero_std'], 2):>6} "
                     f"{ent:>13} {f(r['tis_capped_frac'], 4):>7} {f(r['parity_gap']):>7} {f(r['step_s'], 1):>7} "
                     f"{f(r['episodes_per_s'], 2):>5}")
    return "\n".join(lines)


def plot_runs(result: dict, png: str | Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result["runs"]:
        ax.plot(result["steps"], r["band"], marker="o", label=f"{r['run']} (lr {r['lr']:.0e})")
    ax.set_xlabel("step")
    ax.set_ylabel("band reward (mean of the step's draws)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return Path(png)
