"""`rlvr eval` and `rlvr eval-report`."""
from __future__ import annotations

import json
from pathlib import Path

from envs.split import select_tasks, spread
from orchestrator.eval_report import render_markdown, write_report
from rl.config import ConfigError, RunConfig, load_config


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a served policy on held-out tasks (k samples each, resumable)")
    p.add_argument("--config", help="run YAML (defaults apply without one)")
    p.add_argument("--run-dir", help="a training run: evaluate its held-out split (refuses trained-on tasks)")
    p.add_argument("--split", choices=("test", "train"), default="test",
                   help="which side of the split: held-out (default) or the training tasks (a diagnostic)")
    p.add_argument("--adapter", help="LoRA adapter folder to serve on top of model.path; `none`: model.path alone "
                                     "(default: with --run-dir, the run's last adapter)")
    p.add_argument("--out", help="output dir (default eval.out_dir); rerun with the same one to resume")
    p.add_argument("--tasks-from", metavar="EVAL_DIR",
                   help="the tasks of an earlier evaluation (its plan.json), so a verdict compares policies on "
                        "one task set; each must still be on the chosen side of the split")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.k=3 eval.max_tasks=5")
    p.set_defaults(func=eval_command)

    r = sub.add_parser("eval-report", help="recompute an evaluation's summary, table and plot from its raw "
                                           "records; with several, the verdict comparing the policies")
    r.add_argument("eval_dirs", nargs="+", metavar="EVAL_DIR", help="evaluation out dirs (same held-out tasks)")
    r.add_argument("--names", help="comma-separated policy names, one per EVAL_DIR (default: the dir names)")
    r.add_argument("--start", help="the starting policy (default: the first)")
    r.add_argument("--trained", help="the trained policy (default: the last)")
    r.add_argument("--train-run", help="the trained policy's run dir: its sampled episodes set the matched count")
    r.add_argument("--train-rollouts", type=int, help="episodes training sampled (instead of --train-run)")
    r.add_argument("--out", help="verdict folder (default: the last EVAL_DIR's parent / verdict)")
    r.add_argument("--by-level", action="store_true",
                   help="instead of the verdict: levels.md/.json/.png in --out, each policy by difficulty level; "
                        "a policy's EVAL_DIR may join several folders with '+' (one per level subset)")
    r.set_defaults(func=report_command)


def held_out_tasks(cfg: RunConfig, out_dir: Path, run_dir: str | None, side: str = "test") -> list:
    """One side of the run's split (held-out by default): from a training run's split, or the
    split training would write."""
    if run_dir:
        chosen = select_tasks(cfg.task, cfg.trainer.seed, run_dir, side, trained_split=True)
    else:
        chosen = select_tasks(cfg.task, cfg.trainer.seed, out_dir, side)
    return spread(chosen, cfg.eval.max_tasks, cfg.trainer.seed)


def same_tasks_as(eval_dir: str, side: list) -> list:
    """The tasks an earlier evaluation planned, in its order, taken from this side of the split."""
    plan = Path(eval_dir) / "plan.json"
    if not plan.is_file():
        raise ConfigError(f"--tasks-from {eval_dir}: no plan.json there (not an evaluation's out dir)")
    ids = json.loads(plan.read_text())["tasks"]
    by_id = {t.id: t for t in side}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ConfigError(f"--tasks-from {eval_dir}: {len(missing)} of its tasks are not on this side of the split "
                          f"(first: {missing[0]}); evaluate with the run dir and split that evaluation used")
    return [by_id[i] for i in ids]


def latest_adapter(run_dir: str) -> str | None:
    """The LoRA adapter a training run last synced through its run directory (sync.transport
    shared_dir), else the one in its latest checkpoint; None if neither exists."""
    from orchestrator.checkpoint import latest_checkpoint

    adapters = sorted((Path(run_dir) / "adapters").glob("step_*"))
    found = latest_checkpoint(Path(run_dir))
    if not adapters and found is not None and (found[1] / "learner" / "adapter").is_dir():
        adapters = [found[1] / "learner" / "adapter"]
    if adapters:
        print(f"[eval] serving the trained adapter {adapters[-1]}", flush=True)
        return str(adapters[-1])
    return None


def check_policy_choice(args) -> None:
    """--run-dir serves the run's trained policy: its adapter on model.path (or its merged weights).
    With a model.path override that would silently put the run's adapter on another model, so the
    combination must say what to serve."""
    if args.run_dir and not args.adapter and any(o.startswith("model.path=") for o in args.overrides):
        raise ConfigError("--run-dir with a model.path override: say which policy to serve, `--adapter none` "
                          "(model.path as it is; --run-dir then only names the split) or `--adapter FOLDER`; "
                          "otherwise the run's trained adapter would be served on top of model.path")


def served_adapter(args, cfg: RunConfig) -> str | None:
    """The adapter to serve (None: model.path alone); a run with merged weights and no adapter
    serves those weights instead."""
    if args.adapter:
        return None if args.adapter == "none" else args.adapter
    if not args.run_dir:
        return None
    adapter = latest_adapter(args.run_dir)
    merged = Path(args.run_dir, "merged_weights")
    if adapter is None and (merged / "config.json").is_file():
        print(f"[eval] serving the trained merged weights {merged}", flush=True)
        cfg.model.path = str(merged)
    return adapter


def run_step_served(args, cfg: RunConfig) -> int | None:
    """The training step whose policy this evaluation served, for the run's reward curve: its
    latest checkpoint (the run's adapter), 0 for the model it started from, None otherwise."""
    if not args.run_dir or args.split != "test" or not Path(args.run_dir, "config.yaml").is_file():
        return None
    from orchestrator.checkpoint import latest_checkpoint

    if args.adapter == "none":
        started = load_config(Path(args.run_dir) / "config.yaml").model.path
        return 0 if started == cfg.model.path else None
    found = latest_checkpoint(Path(args.run_dir))
    return found[0] if found is not None and not args.adapter else None


def eval_command(args) -> int:
    # heavy (ray, torch, vLLM's protocol): only the subcommand that serves a model imports them
    import ray

    from orchestrator.cluster import run_evaluator, spawn_env_actors, start_policy

    cfg = load_config(args.config, args.overrides)
    check_policy_choice(args)
    out = Path(args.out or cfg.eval.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.tasks_from:
        cfg.eval.max_tasks = None  # the earlier evaluation's list decides
    tasks = held_out_tasks(cfg, out, args.run_dir, args.split)
    if args.tasks_from:
        tasks = same_tasks_as(args.tasks_from, tasks)
    if not tasks:
        raise ConfigError(f"no {args.split} tasks to evaluate (check task.max_tasks / task.train_fraction)")
    adapter = served_adapter(args, cfg)
    worker, base_url = start_policy(cfg, adapter)
    env_actors = spawn_env_actors(cfg, tasks=tasks, scaffold=cfg.eval.scaffold)
    summary = run_evaluator(cfg, str(out), tasks, base_url, cfg.eval.model_id, env_actors, worker)
    step = run_step_served(args, cfg)
    if step is not None:
        from orchestrator.plots import record_heldout_point

        pass_at = summary["pass_at_k"]
        record_heldout_point(args.run_dir, step, pass_at.get(1, pass_at.get("1", 0.0)), out)
    print(render_markdown(summary, f"{cfg.eval.scaffold} eval (k={cfg.eval.k})"))
    print(f"[rlvr eval] raw records, summary.json, report.md, report.png in {out}")
    ray.get([a.shutdown.remote() for a in env_actors])
    ray.get(worker.shutdown.remote())
    return 0


def report_command(args) -> int:
    if args.by_level:
        from orchestrator.eval_report import render_levels, write_level_report

        names = args.names.split(",") if args.names else [Path(d.split("+")[0]).name for d in args.eval_dirs]
        if len(names) != len(args.eval_dirs):
            raise ConfigError(f"--names gives {len(names)} names for {len(args.eval_dirs)} EVAL_DIRs")
        out = Path(args.out or Path(args.eval_dirs[-1].split("+")[0]).parent / "levels")
        try:
            rows = write_level_report({n: d.split("+") for n, d in zip(names, args.eval_dirs)}, out)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None
        print(render_levels(rows))
        print(f"[rlvr eval-report] levels.md, levels.json, levels.png in {out}")
        return 0
    if len(args.eval_dirs) == 1:
        summary = write_report(args.eval_dirs[0])
        print(render_markdown(summary))
        return 0
    from orchestrator.verdict import render, train_rollouts, write_verdict

    names = args.names.split(",") if args.names else [Path(d).name for d in args.eval_dirs]
    rollouts = args.train_rollouts
    if args.train_run:
        rollouts = train_rollouts(args.train_run)
    out = Path(args.out or Path(args.eval_dirs[-1]).parent / "verdict")
    try:
        verdict = write_verdict(args.eval_dirs, names, out, args.start, args.trained, rollouts)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    print(render(verdict))
    print(f"[rlvr eval-report] verdict.json, verdict.md, verdict.png in {out}")
    return 0
