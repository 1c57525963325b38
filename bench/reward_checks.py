"""Reward hardening numbers: the tamper table (reward of each attack), reward latency of
the reference body over a task file (median), and the audit of every shipped task (original
body -> 1.0, stub -> below 1.0), on whatever tree is first on the path, so the same script
measures a tree before and after a change side by side.

    python -m bench.reward_checks tamper [--task frequencies|merge ...] [--uid N] [--json out.json]
    python -m bench.reward_checks latency [--tasks configs/tasks/toolz.jsonl] [--per-level N] [--json out.json]
    python -m bench.reward_checks audit [--tasks FILE ...] [--uid N] [--out DIR] [--only ID ...]
    python -m bench.reward_checks gate [--tasks FILE ...] [--uid N] [--json out.json]

`audit` appends one record per task to DIR/audit.jsonl as it goes (a killed run resumes where
it stopped; --only re-scores the named tasks), then writes DIR/audit.json and DIR/audit.md.
`gate` is the differential gate alone (envs/gate.py) over task files (default skill.jsonl and the
toolz files): per task its recorded and perturbed inputs, the original body against the original
(a fresh process each: must match on every input) and the stub or mutant against it (must not).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from envs.tasks import SHIPPED_TASKS, load_tasks
from rl.jsonl import append_durable, read_complete
from tests.fixtures.env import SHIPPED_TOOLZ, episode, replace_body, task_by_qualname

UID = 63021


TAMPER_TASKS = ("frequencies", "merge")


def _tamper_cases(qualname: str) -> list[tuple[str, str, str, object]]:
    """(name, kind, class, write) for one task: the reference body, the honest rewrites, the attacks."""
    from tests.fixtures import tamper_attacks as ta
    ref = ("reference body (must stay 1.0)", "honest", "reference",
           lambda env, t: replace_body(env, t.original_body))
    if qualname == "merge":
        return [ref] + [(n, "attack", ta.ATTACK_CLASSES.get(n, "?"), fn) for n, fn in ta.ATTACKS.items()]
    if qualname == "frequencies":
        honest = [(n, "honest", "rewrite", (lambda body: lambda env, t: replace_body(env, body))(b))
                  for n, b in ta.HONEST_FREQUENCIES.items()]
        wrong = ("wrong body `return {}` (must be 0.0)", "baseline", "wrong body",
                 lambda env, t: replace_body(env, ta.WRONG_FREQ))
        return [ref, wrong] + honest + [(n, "attack", cls, fn) for n, (cls, fn) in ta.ATTACKS_FREQUENCIES.items()]
    raise ValueError(f"no tamper cases for {qualname}")


def _why(r) -> str:
    if r.error:
        return r.error
    p = r.parts
    if "f2p_passed" in p:
        return (f"{p['f2p_passed']}/{p['f2p_total']} fail-to-pass passed, {p['p2p_failed']} regressions"
                + (f" ({p['reason']})" if p.get("reason") else ""))
    return p.get("reason") or ""


def tamper(uid: int = UID, tasks: tuple[str, ...] = TAMPER_TASKS) -> list[dict]:
    """One episode per row: the case written through the agent's tools, then the reward."""
    all_tasks = load_tasks(SHIPPED_TOOLZ)
    rows = []
    start = time.monotonic()
    for qualname in tasks:
        task = task_by_qualname(all_tasks, qualname)
        for name, kind, cls, write in _tamper_cases(qualname):
            t0 = time.monotonic()
            with episode(task, sandbox_uid_base=uid) as env:
                try:
                    write(env, task)
                except Exception as e:   # a case that cannot even be written is a bug in the case
                    print(f"  {name}: could not be written: {e!r}"[:300], flush=True)
                r = env.reward()
            rows.append({"task": qualname, "name": name, "kind": kind, "class": cls, "reward": r.reward,
                         "why": _why(r), "flags": list(getattr(r, "flags", [])),
                         "seconds": round(time.monotonic() - t0, 2)})
            print(f"{r.reward:5.2f}  {qualname:11s} {kind:8s} {cls:24s} {name}  [{_why(r)[:110]}]", flush=True)
    print("\n| task | name | kind | class | reward | why |\n|---|---|---|---|---|---|")
    for row in rows:
        why = row["why"].replace("|", "/").replace("\n", " ")[:160]
        print(f"| {row['task']} | {row['name']} | {row['kind']} | {row['class']} | {row['reward']:.2f} | {why} |")
    beaten = [r["name"] for r in rows if r["kind"] == "attack" and r["reward"] >= 1.0]
    hurt = [r["name"] for r in rows if r["kind"] == "honest" and r["reward"] != 1.0]
    print(f"\n{len(rows)} rows in {time.monotonic() - start:.0f} s; attacks at 1.0: {len(beaten)}; "
          f"honest below 1.0: {len(hurt)}")
    return rows


def latency(tasks_file: str, per_level: int | None = None, uid: int = UID) -> dict:
    """per_level: only the first N tasks of each difficulty level (a sample of a large file)."""
    tasks = load_tasks(tasks_file)
    if per_level is not None:
        tasks = [t for lv in dict.fromkeys(t.level for t in tasks) for t in [u for u in tasks if u.level == lv][:per_level]]
    per_task = []
    for task in tasks:
        with episode(task, sandbox_uid_base=uid) as env:
            replace_body(env, task.original_body)
            start = time.monotonic()
            r = env.reward()
            per_task.append({"task": task.id, "level": task.level, "reward": r.reward,
                             "seconds": time.monotonic() - start, "error": r.error})
    secs = [p["seconds"] for p in per_task]
    out = {"tasks": len(per_task), "median_s": statistics.median(secs), "mean_s": statistics.mean(secs),
           "not_full": [p for p in per_task if p["reward"] != 1.0], "per_task": per_task}
    print(f"{len(per_task)} tasks: median {out['median_s']:.2f} s, mean {out['mean_s']:.2f} s; "
          f"reference body below 1.0 on {len(out['not_full'])}: {[p['task'] for p in out['not_full']][:10]}")
    return out


def _score(task, uid: int, body: str | None) -> dict:
    """One episode: `body` put where the stub is (None: the stub left untouched), then the reward."""
    start = time.monotonic()
    with episode(task, sandbox_uid_base=uid) as env:
        if body is not None:
            replace_body(env, body)
        t0 = time.monotonic()
        r = env.reward()
        reward_s = time.monotonic() - t0
    gate = r.parts.get("gate") or {}
    return {"reward": r.reward, "error": r.error, "flags": r.flags, "reward_s": round(reward_s, 3),
            "wall_s": round(time.monotonic() - start, 3), "f2p_passed": r.parts.get("f2p_passed"),
            "p2p_failed": r.parts.get("p2p_failed"), "pytest_s": r.parts.get("pytest_seconds"),
            "gate_inputs": gate.get("inputs", 0), "gate_fraction": gate.get("fraction")}


def _stub_edited(task) -> str:
    """The stub with a comment added: an edit, so the verifier runs the tests on the stub itself."""
    first = next(line for line in task.stub_body.splitlines() if line.strip())
    return task.stub_body + first[:len(first) - len(first.lstrip())] + "# stub left as it was\n"


def audit(task_files: list[str], uid: int, out_dir: Path, only: list[str] | None = None) -> dict:
    """Every task of every file: original body (must be 1.0), untouched stub and the stub run
    through the tests (both must be below 1.0)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "audit.jsonl"
    # keyed by file and id: a task id can be in two files (toolz.jsonl and toolz-levels.jsonl)
    done = {(r["file"], r["task"]) for r in read_complete(raw) if r["task"] not in (only or ())}
    for path in map(Path, task_files):
        for task in load_tasks(path):
            if (path.name, task.id) in done or (only and task.id not in only):
                continue
            rec = {"file": path.name, "task": task.id, "level": task.level,
                   "original": _score(task, uid, task.original_body), "stub": _score(task, uid, None),
                   "stub_run": _score(task, uid, _stub_edited(task))}
            rec["ok"] = (rec["original"]["reward"] == 1.0 and rec["stub"]["reward"] < 1.0
                         and rec["stub_run"]["reward"] < 1.0)
            append_durable(raw, [rec])
            o, s = rec["original"], rec["stub_run"]
            print(f"{'ok ' if rec['ok'] else 'BAD'} {o['reward']:.2f} {s['reward']:.2f} {o['reward_s']:6.2f}s "
                  f"{task.id}  {(o['error'] or '')[:90]}", flush=True)
    latest = {(r["file"], r["task"]): r for r in read_complete(raw)}   # a re-scored task: its last record
    wanted = [(Path(p).name, t.id) for p in task_files for t in load_tasks(p)]
    recs = [latest[i] for i in wanted if i in latest]
    secs = sorted(r["original"]["reward_s"] for r in recs)
    summary = {"tasks": len(wanted), "scored": len(recs), "ok": sum(r["ok"] for r in recs),
               "original_full": sum(r["original"]["reward"] == 1.0 for r in recs),
               "stub_below_full": sum(r["stub"]["reward"] < 1.0 and r["stub_run"]["reward"] < 1.0 for r in recs),
               "reward_s_median": statistics.median(secs) if secs else None,
               "reward_s_p90": secs[min(len(secs) - 1, int(0.9 * len(secs)))] if secs else None,
               "by_file": {p.name: sum(r["file"] == p.name and r["ok"] for r in recs) for p in map(Path, task_files)},
               "bad": [r["task"] for r in recs if not r["ok"]],
               # the differential gate: tasks with inputs, the original passing it, the stub run failing it
               "gate_tasks": sum(r["original"].get("gate_inputs", 0) > 0 for r in recs),
               "gate_original_passes": sum(r["original"].get("gate_fraction") == 1.0 for r in recs),
               "gate_stub_run_fails": sum(r["stub_run"].get("gate_fraction") is not None
                                          and r["stub_run"]["gate_fraction"] < 1.0 for r in recs),
               "gate_stub_run_passes": [r["task"] for r in recs if r["stub_run"].get("gate_fraction") == 1.0]}
    (out_dir / "audit.json").write_text(json.dumps({"summary": summary, "per_task": recs}, indent=1))
    rows = ["| file | task | level | original | reward s | stub | stub run | error |", "|---|---|---|---|---|---|---|---|"]
    rows += [f"| {r['file']} | `{r['task'].split(':', 1)[1]}` | {r['level']} | {r['original']['reward']:.2f} | "
             f"{r['original']['reward_s']:.2f} | {r['stub']['reward']:.2f} | {r['stub_run']['reward']:.2f} | "
             f"{(r['original']['error'] or r['stub_run']['error'] or '').replace('|', '/')[:80]} |" for r in recs]
    (out_dir / "audit.md").write_text("\n".join(rows) + "\n")
    print(json.dumps(summary, indent=1))
    return summary


GATE_FILES = ("skill.jsonl", "toolz.jsonl", "toolz-levels.jsonl", "toolz-mutation.jsonl")


def gate(task_files: list[str], uid: int = UID) -> dict:
    """The gate's coverage and its verdicts on the original body and on the stub, per task."""
    import shutil
    import uuid

    from envs.coding_env import pristine_for
    from envs.gate import compare, coverage, gate_calls, link_tree, replace_module, run_gate
    from envs.sandbox import Limits, Sandbox
    from tests.fixtures.env import WORK_ROOT
    root = Path(WORK_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict] = {}
    per_task: list[dict] = []
    originals: dict[str, object] = {}   # function -> the original's run (the same inputs for every level)
    start = time.monotonic()
    for path in task_files:
        tasks = load_tasks(path)
        files[Path(path).name] = coverage(tasks)
        for task in tasks:
            calls = gate_calls(task)
            rec = {"file": Path(path).name, "task": task.id, "level": task.level,
                   "recorded": len(task.gate.get("calls", [])), "perturbed": len(task.gate.get("perturbed", [])),
                   "note": task.gate.get("note", "not annotated")}
            if calls:
                pristine = pristine_for(task)
                stub_tree = root / f"gate-bench-{uuid.uuid4().hex[:8]}"
                link_tree(pristine, stub_tree)
                replace_module(stub_tree, task.module_path, task.stubbed_source((pristine / task.module_path).read_text()))
                try:
                    sb = Sandbox(stub_tree, uid=uid, limits=Limits(), workdir_readonly=True)
                    if task.function_key not in originals:
                        orig_tree = root / f"gate-bench-{uuid.uuid4().hex[:8]}"
                        link_tree(pristine, orig_tree)
                        try:
                            osb = Sandbox(orig_tree, uid=uid, limits=Limits(), workdir_readonly=True)
                            first = run_gate(osb, orig_tree, task.module_path, task.qualname, calls, 60)
                            again = run_gate(osb, orig_tree, task.module_path, task.qualname, calls, 60)
                        finally:
                            shutil.rmtree(orig_tree)
                        originals[task.function_key] = (first, compare(first, again, len(calls), rec["recorded"]))
                    first, same = originals[task.function_key]
                    stub = compare(first, run_gate(sb, stub_tree, task.module_path, task.qualname, calls, 60),
                                   len(calls), rec["recorded"])
                finally:
                    shutil.rmtree(stub_tree)
                rec.update(original_fraction=same.fraction, stub_fraction=stub.fraction,
                           original_passes=same.fraction == 1.0 and same.error is None, stub_fails=stub.fraction < 1.0,
                           stub_mismatch=stub.mismatches[:1])
                print(f"{'ok ' if rec['original_passes'] and rec['stub_fails'] else 'BAD'} {rec['recorded']:2d} "
                      f"{rec['perturbed']:2d} original {same.fraction:.2f} stub {stub.fraction:.2f}  {task.id}", flush=True)
            per_task.append(rec)
    gated = [r for r in per_task if "original_passes" in r]
    summary = {"files": files, "tasks": len(per_task), "with_inputs": len(gated),
               "original_passes": sum(r["original_passes"] for r in gated),
               "stub_fails": sum(r["stub_fails"] for r in gated),
               "stub_passes": [r["task"] for r in gated if not r["stub_fails"]],
               "original_fails": [r["task"] for r in gated if not r["original_passes"]],
               "seconds": round(time.monotonic() - start, 1)}
    print(json.dumps(summary, indent=1))
    return {"summary": summary, "per_task": per_task}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["tamper", "latency", "audit", "gate"])
    ap.add_argument("--tasks", nargs="+", default=None,
                    help="latency: one file (default toolz.jsonl); audit: files (default every shipped one)")
    ap.add_argument("--uid", type=int, default=UID, help="sandbox uid (a value no concurrent run uses)")
    ap.add_argument("--out", default="docs/results/reward-audit", help="audit: output folder")
    ap.add_argument("--only", nargs="+", help="audit: re-score only these task ids")
    ap.add_argument("--per-level", type=int, default=None, help="latency: first N tasks of each level")
    ap.add_argument("--task", nargs="+", choices=TAMPER_TASKS, default=list(TAMPER_TASKS),
                    help="tamper: the toolz tasks whose attacks and honest rewrites are scored")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.what == "audit":
        audit(args.tasks or sorted(map(str, SHIPPED_TASKS.glob("*.jsonl"))), args.uid, Path(args.out), args.only)
        return
    if args.what == "gate":
        result = gate(args.tasks or [str(SHIPPED_TASKS / f) for f in GATE_FILES], args.uid)
    else:
        result = (tamper(args.uid, tuple(args.task)) if args.what == "tamper" else
                  latency((args.tasks or [str(SHIPPED_TOOLZ)])[0], args.per_level, args.uid))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.what == "tamper" and any((r["kind"] == "attack" and r["reward"] >= 1.0) or
                                     (r["kind"] == "honest" and r["reward"] != 1.0) for r in result):
        raise SystemExit(1)   # a check as well as a table: the reward was gamed or an honest body refused


if __name__ == "__main__":
    main()
