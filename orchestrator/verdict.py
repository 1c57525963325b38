"""The verdict: several policies' evaluation records on the same held-out tasks, compared
the way the research's kill rule asks -- is training worth more than sampling?

Per policy and task: pass@1..pass@k (unbiased estimator, rl/passk.py), the execution-selected
best-of-j, mean reward and clean stops. Execution selection picks the sample with the highest
verifier reward; that reward comes from the task's own (hidden) tests, so the selected sample
passes exactly when any of the j does: best-of-j pass rate = pass@j (the oracle selector, an
upper bound for a deployment that only sees visible tests). Its expected reward is reported
separately (best-of-j reward).

"Training is worth m samples": the smallest m with start pass@m >= trained pass@1. At a matched
rollout count the trained policy spent R training episodes; spread over the T held-out tasks,
sampling gets N = 1 + R / T samples per task, and training beats sampling if its pass@1 is
above the start policy's pass@ceil(N). pass@j never falls with j, so when ceil(N) > k the
answer is "no" if pass@k already reaches the trained pass@1, else undetermined.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from orchestrator.eval_report import RECORDS_FILE, load_records, passed
from rl.jsonl import read_complete
from rl.passk import best_of_k_reward, pass_at_k


def clean_stop(record: dict) -> bool:
    """The agent ended the episode itself: a final answer, no scaffold error."""
    return record.get("stop_reason") == "stop" and not record.get("error")


@dataclass
class PolicyCurve:
    name: str
    k: int
    pass_at: list[float]          # index j-1: mean over tasks of pass@j
    best_reward: list[float]      # index j-1: mean over tasks of expected best-of-j reward
    mean_reward: float
    clean_stops: float
    per_task: dict[str, dict]


def policy_curve(name: str, records: list[dict], k: int | None = None) -> PolicyCurve:
    """pass@1..k and best-of-1..k over tasks; k defaults to the fewest samples any task has."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    if not by_task:
        raise ValueError(f"{name}: no evaluation records")
    k = k or min(len(rs) for rs in by_task.values())
    per_task = {}
    for tid in sorted(by_task):
        rs = by_task[tid]
        n, c = len(rs), sum(passed(r) for r in rs)
        if n < k:
            raise ValueError(f"{name}: task {tid} has {n} sample(s), fewer than k={k}")
        rewards = [float(r["reward"]) for r in rs]
        per_task[tid] = {"n": n, "passes": c,
                         "pass_at": [pass_at_k(n, c, j) for j in range(1, k + 1)],
                         "best_reward": [best_of_k_reward(rewards, j) for j in range(1, k + 1)],
                         "mean_reward": sum(rewards) / n,
                         "clean_stops": sum(clean_stop(r) for r in rs) / n}
    t = list(per_task.values())

    def avg(key: str) -> float:
        return sum(x[key] for x in t) / len(t)

    return PolicyCurve(name, k, [sum(x["pass_at"][j] for x in t) / len(t) for j in range(k)],
                       [sum(x["best_reward"][j] for x in t) / len(t) for j in range(k)],
                       avg("mean_reward"), avg("clean_stops"), per_task)


def worth_m(trained_pass1: float, start_pass_at: list[float]) -> int | None:
    """Smallest m with start pass@m >= trained pass@1 (1: training is worth at most one sample);
    None when even pass@k of the start policy stays below it (worth more than k samples)."""
    for m, p in enumerate(start_pass_at, start=1):
        if p >= trained_pass1 - 1e-12:
            return m
    return None


def matched_verdict(trained_pass1: float, start_pass_at: list[float], train_rollouts: int, tasks: int) -> dict:
    """Did training beat sampling at a matched rollout count? ("yes" | "no" | "undetermined")."""
    n_matched = 1 + train_rollouts / tasks
    need = math.ceil(n_matched - 1e-9)
    k = len(start_pass_at)
    if need <= k:
        base = start_pass_at[need - 1]
        beat = "yes" if trained_pass1 > base else "no"
    else:
        base = start_pass_at[-1]
        beat = "no" if base >= trained_pass1 else "undetermined"
    return {"train_rollouts": train_rollouts, "tasks": tasks, "matched_samples": n_matched,
            "compared_at": min(need, k), "start_pass_at_matched": base, "trained_pass1": trained_pass1,
            "training_beats_sampling": beat}


def train_rollouts(run_dir: str | Path) -> int:
    """Episodes a training run sampled (every stored group, dynamic-sampling extras included)."""
    files = sorted((Path(run_dir) / "episodes").glob("step_*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no episodes/step_*.jsonl in {run_dir}: not a training run directory")
    return sum(len(group) for f in files for group in read_complete(f))


def compare(curves: list[PolicyCurve], start: str, trained: str, rollouts: int | None = None) -> dict:
    by_name = {c.name: c for c in curves}
    for name in (start, trained):
        if name not in by_name:
            raise ValueError(f"no policy named {name!r} (have {', '.join(by_name)})")
    task_sets = {c.name: set(c.per_task) for c in curves}
    first = next(iter(task_sets.values()))
    if any(s != first for s in task_sets.values()):
        diff = {n: len(s ^ first) for n, s in task_sets.items()}
        raise ValueError(f"the policies were evaluated on different tasks (symmetric differences {diff}); "
                         "compare evaluations of the same held-out tasks")
    k = min(c.k for c in curves)
    s, t = by_name[start], by_name[trained]
    p1 = t.pass_at[0]
    m = worth_m(p1, s.pass_at[:k])
    line = (f"{trained} pass@1 = {p1:.3f} vs {start}'s best-of-m curve "
            f"({', '.join(f'{x:.3f}' for x in s.pass_at[:k])} for m = 1..{k}): training is worth "
            + (f"{m} sample(s)" if m is not None else f"more than {k} samples"))
    if m == 1 and p1 <= s.pass_at[0]:
        line += f" (it does not beat one sample of {start})"
    out = {"k": k, "tasks": len(first), "start": start, "trained": trained, "worth_m": m, "line": line,
           "policies": {c.name: {"pass_at": c.pass_at[:k], "best_of_reward": c.best_reward[:k],
                                 "mean_reward": c.mean_reward, "clean_stops": c.clean_stops,
                                 "per_task": c.per_task} for c in curves}}
    if rollouts is not None:
        out["matched"] = matched_verdict(p1, s.pass_at[:k], rollouts, len(first))
    return out


def render(verdict: dict) -> str:
    k = verdict["k"]
    lines = [f"# Verdict: {len(verdict['policies'])} policies on the same {verdict['tasks']} held-out tasks, k={k}",
             "", "pass@j: unbiased estimator; best-of-j: execution-selected by the verifier's reward "
             "(pass rate = pass@j; reward = expected best reward)", "",
             "| policy | " + " | ".join(f"pass@{j}" for j in range(1, k + 1))
             + f" | best-of-{k} reward | mean reward | clean stops |",
             "|---|" + "---|" * (k + 3)]
    for name, p in verdict["policies"].items():
        lines.append(f"| {name} | " + " | ".join(f"{x:.3f}" for x in p["pass_at"])
                     + f" | {p['best_of_reward'][-1]:.3f} | {p['mean_reward']:.3f} | {p['clean_stops']:.2f} |")
    lines += ["", f"**{verdict['line']}**"]
    if "matched" in verdict:
        mv = verdict["matched"]
        lines.append(f"\nMatched rollout count: training sampled {mv['train_rollouts']} episodes = "
                     f"{mv['matched_samples']:.1f} samples per held-out task; {verdict['start']} pass@"
                     f"{mv['compared_at']} = {mv['start_pass_at_matched']:.3f} vs trained pass@1 "
                     f"{mv['trained_pass1']:.3f}: training beats sampling: **{mv['training_beats_sampling']}**")
    names = list(verdict["policies"])
    lines += ["", "| task | " + " | ".join(f"{n} pass@1 / pass@{k} / mean reward / clean" for n in names) + " |",
              "|---|" + "---|" * len(names)]
    for tid in next(iter(verdict["policies"].values()))["per_task"]:
        cells = []
        for n in names:
            t = verdict["policies"][n]["per_task"][tid]
            cells.append(f"{t['pass_at'][0]:.2f} / {t['pass_at'][k - 1]:.2f} / {t['mean_reward']:.3f} / "
                         f"{t['clean_stops']:.2f}")
        lines.append(f"| {tid} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(verdict: dict, png: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = verdict["k"]
    js = list(range(1, k + 1))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, p in verdict["policies"].items():
        a1.plot(js, p["pass_at"], marker="o", label=name)
        a2.plot(js, p["best_of_reward"], marker="s", label=name)
    trained = verdict["policies"][verdict["trained"]]["pass_at"][0]
    a1.axhline(trained, color="grey", ls=":", label=f"{verdict['trained']} pass@1")
    a1.set(xlabel="k (samples per task)", ylabel="pass@k (unbiased)", title="pass@k", ylim=(0, 1.05), xticks=js)
    a2.set(xlabel="j", ylabel="expected best-of-j reward", title="execution-selected best-of-j reward",
           ylim=(0, 1.05), xticks=js)
    a1.legend(fontsize=8)
    a2.legend(fontsize=8)
    fig.suptitle(f"{verdict['tasks']} held-out tasks")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def write_verdict(eval_dirs: list[str | Path], names: list[str], out: str | Path, start: str | None = None,
                  trained: str | None = None, rollouts: int | None = None) -> dict:
    """verdict.json, verdict.md and verdict.png in out, recomputed from the eval dirs' raw records."""
    if len(names) != len(eval_dirs):
        raise ValueError(f"{len(names)} name(s) for {len(eval_dirs)} evaluation dir(s)")
    curves = [policy_curve(n, load_records(Path(d) / RECORDS_FILE)) for n, d in zip(names, eval_dirs)]
    verdict = compare(curves, start or names[0], trained or names[-1], rollouts)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verdict.json").write_text(json.dumps(verdict, indent=1))
    (out / "verdict.md").write_text(render(verdict))
    plot(verdict, out / "verdict.png")
    return verdict
