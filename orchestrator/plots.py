"""Reward-curve PNG next to a run's metrics."""
from __future__ import annotations

import json
from pathlib import Path

from orchestrator.metrics import read_metrics
from rl.jsonl import read_complete

HELDOUT_FILE = "heldout.jsonl"   # one line per held-out evaluation of the run: step, pass@1, its folder


def record_heldout_point(run_dir: str | Path, step: int, pass_at_1: float, eval_dir: str | Path) -> None:
    """A held-out evaluation of the run's policy at `step` (0: the model it started from), drawn
    on its reward curve; a later evaluation into the same folder replaces the earlier one."""
    path = Path(run_dir) / HELDOUT_FILE
    kept = [p for p in read_complete(path) if p["eval_dir"] != str(eval_dir)]
    path.write_text("".join(json.dumps(p) + "\n" for p in
                            [*kept, {"step": step, "pass@1": pass_at_1, "eval_dir": str(eval_dir)}]))
    plot_reward_curve(run_dir)


def plot_reward_curve(run_dir: str | Path) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    if not records:
        return None
    steps = [r["step"] for r in records]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    mean = [r.get("reward_mean", float("nan")) for r in records]
    std = [r.get("reward_std", float("nan")) for r in records]
    axes[0].plot(steps, mean, marker="o", label="reward mean")
    axes[0].fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    if any("band/reward_mean" in r for r in records):
        axes[0].plot(steps, [r.get("band/reward_mean", float("nan")) for r in records], marker="s", ls="--",
                     label="band reward mean (fixed draws)")
        axes[0].legend(fontsize=8)
    heldout = read_complete(Path(run_dir) / HELDOUT_FILE)
    if heldout:   # held-out evaluations of this run's start (step 0) and trained policies
        axes[0].plot([p["step"] for p in heldout], [p["pass@1"] for p in heldout], "*", ms=12, color="tab:red",
                     label="held-out pass@1 (rlvr eval --run-dir)")
        axes[0].legend(fontsize=8)
    axes[0].set_xlabel("step"); axes[0].set_ylabel("reward"); axes[0].set_title("reward (served policy samples)")
    for key in ("frac_edited", "tools/failure_frequency", "clipped_ratio", "frac_reward_zero_std"):
        if any(key in r for r in records):
            axes[1].plot(steps, [r.get(key, float("nan")) for r in records], marker=".", label=key)
    axes[1].set_xlabel("step"); axes[1].set_ylim(-0.05, 1.05); axes[1].legend(fontsize=8); axes[1].set_title("engagement")
    fig.tight_layout()
    out = Path(run_dir) / "reward_curve.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_pass_rates(band: dict, png: str | Path) -> Path:
    """Histogram of calibrated per-task pass rates, stacked by difficulty level, with the band
    shaded: how much of the task set the policy passes sometimes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k, levels, by = band["k"], band.get("levels", {}), band.get("by", "pass_rate")
    names = sorted({levels.get(t, "?") for t in band["per_task"]})
    edges = [(i - 0.5) / k for i in range(k + 2)]           # one bar per possible pass count at n = k
    fig, ax = plt.subplots(figsize=(6, 3.5))
    inside = [i / k for i in range(k + 1) if band["lo"] <= i / k <= band["hi"]]
    if inside and by == "pass_rate":
        ax.axvspan(inside[0] - 0.5 / k, inside[-1] + 0.5 / k, color="tab:green", alpha=0.12, label="band")
    ax.hist([[t[by] for tid, t in band["per_task"].items() if levels.get(tid, "?") == name] for name in names],
            bins=edges, stacked=True, label=names, rwidth=0.85)
    ax.set_xlabel(f"{by.replace('_', ' ')} over k={k} episodes"); ax.set_ylabel("tasks")
    ax.set_title(f"{band['calibrated']} calibrated tasks; {len(band['tasks'])} in the band ({by} in "
                 f"[{band['lo']}, {band['hi']}])", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return Path(png)


def plot_levels(rows: list[dict], png: str | Path) -> Path:
    """pass@1 and pass@k by difficulty level, one bar per policy (orchestrator.eval_report.level_rows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({r["level"] for r in rows})
    names = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    width = 0.8 / len(names)
    for ax, key in zip(axes, ("pass@1", "pass@k")):
        for i, name in enumerate(names):
            vals = [next((r[key] for r in rows if r["policy"] == name and r["level"] == lv), 0.0) for lv in levels]
            ax.bar([j + i * width for j in range(len(levels))], vals, width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], levels, rotation=20)
        ax.set_title(f"{key} on held-out tasks (pi)")
    axes[0].set_ylabel("mean over tasks (unbiased estimator)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return Path(png)
