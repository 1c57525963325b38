"""Evaluation records and the reports computed from them.

The raw per-episode records (one JSON line each, appended durably as episodes finish) are the
only stored truth; every summary, table and plot is recomputed from them, so a resumed or
partly re-run evaluation can never report a stale aggregate.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from orchestrator.metrics import episode_rates
from rl.jsonl import append_durable, read_complete
from rl.passk import pass_at_k
from rl.types import LEVELS

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


def task_level(task_id: str) -> str:
    """A task id's difficulty level: `...:qualname` is body, `...:qualname:return` a partial
    level, `...:qualname:mutation@88` a mutant."""
    last = task_id.rsplit(":", 1)[-1]
    level = last.split("@", 1)[0]
    return level if level in LEVELS else "body"


def _by_level(tasks: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for t in tasks:
        out[t["level"]].append(t)
    return out


def pass_at_k_curve(tasks: list[dict]) -> dict[int, float]:
    """Mean over tasks of the unbiased pass@k, k = 1 .. the fewest samples a task has."""
    if not tasks:
        return {}
    n_min = min(t["n"] for t in tasks)
    return {k: sum(pass_at_k(t["n"], t["passes"], k) for t in tasks) / len(tasks) for k in range(1, n_min + 1)}


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
            "best_passed": passed(best), "passes": sum(passed(r) for r in rs), "level": task_level(task_id),
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
        # edits the tool applied (its oldText was the file's text) among the edit calls
        "edit_success_rate": (1 - sum(r.get("edit_failures") or 0 for r in records)
                              / sum(r.get("edits") or 0 for r in records)
                              if any(r.get("edits") for r in records) else None),
        "edit_calls": sum(r.get("edits") or 0 for r in records),
        "pass_at_k": pass_at_k_curve(tasks),
        "by_level": {lv: {"tasks": len(ts), "pass_at_k": pass_at_k_curve(ts),
                          "tasks_passed_at_n": sum(t["passes"] > 0 for t in ts)}
                     for lv, ts in sorted(_by_level(tasks).items())},
        "mean_seconds": mean([float(r.get("seconds", 0)) for r in records]),
        **{k.split("/")[1]: v for k, v in episode_rates(records).items()},
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
             f"edits applied: {'-' if s['edit_success_rate'] is None else format(s['edit_success_rate'], '.2f')} "
             f"of {s['edit_calls']} · "
             f"seconds/episode: {s['mean_seconds']:.1f}"
             + (f" · decode {s['seq_decode_tok_s']:.0f} tok/s a sequence" if "seq_decode_tok_s" in s else "")
             + (f" · host load {s['host_load_per_core']:.2f} per core" if "host_load_per_core" in s else ""), "",
             "stop reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(s["stop_reasons"].items())), "",
             "| level | tasks | pass@1 | pass@k (k = samples) | tasks with a pass |", "|---|---|---|---|---|",
             *[f"| {lv} | {b['tasks']} | {b['pass_at_k'].get(1, 0):.3f} | "
               f"{max(b['pass_at_k'].items())[1] if b['pass_at_k'] else 0:.3f} | {b['tasks_passed_at_n']} |"
               for lv, b in s["by_level"].items()], "",
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


def level_rows(name: str, records: list[dict]) -> list[dict]:
    """One row per difficulty level of one policy's records: pass@1 and pass@k (k = the fewest
    samples a task has), tasks with a pass, edits applied among edit calls, tool-failure rate."""
    summary = summarize(records)
    level = {t["task"]: t["level"] for t in summary["per_task"]}
    rows = []
    for lv, b in summary["by_level"].items():
        rs = [r for r in records if level[r["task"]] == lv]
        edits, failed = sum(r.get("edits") or 0 for r in rs), sum(r.get("edit_failures") or 0 for r in rs)
        calls, tool_failed = sum(r.get("tool_calls") or 0 for r in rs), sum(r.get("tool_failures") or 0 for r in rs)
        k = max(b["pass_at_k"]) if b["pass_at_k"] else 0
        rows.append({"policy": name, "level": lv, "tasks": b["tasks"], "k": k, "pass@1": b["pass_at_k"].get(1, 0.0),
                     "pass@k": b["pass_at_k"].get(k, 0.0), "tasks_with_a_pass": b["tasks_passed_at_n"],
                     "edit_success_rate": 1 - failed / edits if edits else None, "edit_calls": edits,
                     "tool_failure_rate": tool_failed / calls if calls else 0.0, "episodes": len(rs)})
    return rows


def render_levels(rows: list[dict]) -> str:
    lines = ["| policy | level | tasks | k | pass@1 | pass@k | tasks with a pass | edits applied | edit calls | "
             "tool-failure rate |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        edit = "-" if r["edit_success_rate"] is None else f"{r['edit_success_rate']:.2f}"
        lines.append(f"| {r['policy']} | {r['level']} | {r['tasks']} | {r['k']} | {r['pass@1']:.3f} | {r['pass@k']:.3f} | "
                     f"{r['tasks_with_a_pass']}/{r['tasks']} ({r['tasks_with_a_pass'] / r['tasks']:.0%}) | {edit} | "
                     f"{r['edit_calls']} | {r['tool_failure_rate']:.2f} |")
    return "\n".join(lines) + "\n"


def write_level_report(policies: dict[str, list[str | Path]], out: str | Path) -> list[dict]:
    """levels.md, levels.json and levels.png in `out`: each policy's records (from one or more
    evaluation folders, e.g. one per level subset) by difficulty level."""
    from orchestrator.plots import plot_levels

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, dirs in policies.items():
        records = [r for d in dirs for r in load_records(Path(d) / RECORDS_FILE)]
        if not records:
            raise ValueError(f"{name}: no finished episodes in {', '.join(map(str, dirs))}")
        rows += level_rows(name, records)
    (out / "levels.md").write_text(render_levels(rows))
    (out / "levels.json").write_text(json.dumps(rows, indent=1))
    plot_levels(rows, out / "levels.png")
    return rows
