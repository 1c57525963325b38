"""Evaluation records and the reports computed from them.

The raw per-episode records (one JSON line each, appended durably as episodes finish) are the
only stored truth; every summary, table and plot is recomputed from them, so a resumed or
partly re-run evaluation can never report a stale aggregate.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from rl.jsonl import append_durable, read_complete

RECORDS_FILE = "episodes.jsonl"
PASS_REWARD = 1.0  # the reward for a full pass (every FAIL_TO_PASS and PASS_TO_PASS test)


def record_key(record: dict) -> tuple[str, int]:
    return record["task"], int(record["sample"])


def append_record(path: str | Path, record: dict) -> None:
    """Append one finished episode durably, so a kill right after loses nothing."""
    for field in ("task", "sample", "reward"):
        if field not in record:
            raise ValueError(f"evaluation record lacks {field!r}: {record}")
    append_durable(path, [record], sort_keys=True)


def load_records(path: str | Path) -> list[dict]:
    """Finished episodes, first record per (task, sample) wins; a torn last line was an
    episode that did not finish (it runs again on resume), damage elsewhere is an error."""
    records, seen = [], set()
    for rec in read_complete(path):
        key = record_key(rec)
        if key not in seen:
            seen.add(key)
            records.append(rec)
    return records


def passed(record: dict) -> bool:
    return float(record["reward"]) >= PASS_REWARD


def summarize(records: list[dict]) -> dict:
    """Single-shot vs execution-selected best-of-N, per task and overall.

    single_shot_pass_rate: mean over tasks of the fraction of samples that pass (expected
    pass@1). best_of_n_pass_rate: fraction of tasks whose highest-reward sample passes (the
    one the tests would select). Rewards are averaged the same two ways.
    """
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    tasks = []
    for task_id in sorted(by_task):
        rs = sorted(by_task[task_id], key=lambda r: int(r["sample"]))
        rewards = [float(r["reward"]) for r in rs]
        best = max(rs, key=lambda r: float(r["reward"]))
        tasks.append({
            "task": task_id, "n": len(rs),
            "pass_rate": sum(passed(r) for r in rs) / len(rs),
            "mean_reward": sum(rewards) / len(rs),
            "best_reward": float(best["reward"]), "best_sample": int(best["sample"]),
            "best_passed": passed(best),
        })
    n_tasks = len(tasks)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    ns = sorted({t["n"] for t in tasks})
    return {
        "episodes": len(records), "tasks": n_tasks,
        "samples_per_task": ns[0] if len(ns) == 1 else ns,
        "single_shot_pass_rate": mean([t["pass_rate"] for t in tasks]),
        "best_of_n_pass_rate": mean([1.0 if t["best_passed"] else 0.0 for t in tasks]),
        "single_shot_mean_reward": mean([t["mean_reward"] for t in tasks]),
        "best_of_n_mean_reward": mean([t["best_reward"] for t in tasks]),
        "edited_rate": mean([1.0 if r.get("edited") else 0.0 for r in records]),
        "mean_turns": mean([float(r.get("turns", 0)) for r in records]),
        "mean_tool_calls": mean([float(r.get("tool_calls", 0)) for r in records]),
        "tool_failure_rate": (sum(r.get("tool_failures", 0) for r in records)
                              / max(1, sum(r.get("tool_calls", 0) for r in records))),
        "mean_seconds": mean([float(r.get("seconds", 0)) for r in records]),
        "stop_reasons": dict(Counter(str(r.get("stop_reason")) for r in records)),
        "per_task": tasks,
    }


def render_markdown(summary: dict, title: str = "Evaluation") -> str:
    s = summary
    lines = [f"# {title}", "",
             f"{s['tasks']} tasks x {s['samples_per_task']} samples = {s['episodes']} episodes "
             "(recomputed from the raw episode records)", "",
             "| metric | single-shot | best-of-N (execution-selected) |", "|---|---|---|",
             f"| pass rate | {s['single_shot_pass_rate']:.3f} | {s['best_of_n_pass_rate']:.3f} |",
             f"| mean reward | {s['single_shot_mean_reward']:.3f} | {s['best_of_n_mean_reward']:.3f} |", "",
             f"edited: {s['edited_rate']:.2f} · turns/episode: {s['mean_turns']:.1f} · tool calls/episode: "
             f"{s['mean_tool_calls']:.1f} · tool failure rate: {s['tool_failure_rate']:.2f} · "
             f"seconds/episode: {s['mean_seconds']:.1f}", "",
             "stop reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(s["stop_reasons"].items())), "",
             "| task | n | pass rate | mean reward | best reward |", "|---|---|---|---|---|"]
    for t in s["per_task"]:
        lines.append(f"| {t['task']} | {t['n']} | {t['pass_rate']:.2f} | {t['mean_reward']:.3f} | "
                     f"{t['best_reward']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, png_path: str | Path, title: str = "Evaluation") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = summary["per_task"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 3]})
    labels = ["pass rate", "mean reward"]
    single = [summary["single_shot_pass_rate"], summary["single_shot_mean_reward"]]
    best = [summary["best_of_n_pass_rate"], summary["best_of_n_mean_reward"]]
    xs = range(len(labels))
    ax1.bar([x - 0.2 for x in xs], single, 0.4, label="single-shot")
    ax1.bar([x + 0.2 for x in xs], best, 0.4, label=f"best-of-{summary['samples_per_task']}")
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylim(0, 1.05)
    ax1.legend()
    ax1.set_title(f"{summary['tasks']} tasks, {summary['episodes']} episodes")
    names = [t["task"].rsplit(":", 1)[-1] for t in tasks]
    xt = range(len(tasks))
    ax2.bar([x - 0.2 for x in xt], [t["mean_reward"] for t in tasks], 0.4, label="mean reward")
    ax2.bar([x + 0.2 for x in xt], [t["best_reward"] for t in tasks], 0.4, label="best reward")
    ax2.set_xticks(list(xt), names, rotation=60, ha="right", fontsize=7)
    ax2.set_ylim(0, 1.05)
    ax2.legend()
    ax2.set_title("per task")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def write_report(out_dir: str | Path, title: str = "Evaluation") -> dict:
    """Recompute summary.json, report.md and report.png from the raw records in out_dir."""
    out = Path(out_dir)
    records = load_records(out / RECORDS_FILE)
    if not records:
        raise ValueError(f"no finished episodes in {out / RECORDS_FILE}; nothing to report")
    summary = summarize(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "report.md").write_text(render_markdown(summary, title))
    plot(summary, out / "report.png", title)
    return summary
