"""`rlvr harvest`: k episodes per training task through the configured scaffold against a
served policy (the run's own model by default, or another OpenAI-compatible endpoint with
--base-url/--model); passing, short episodes become warm-start rows (`rows.jsonl`), which
`warm_start.harvest_dirs` then adds to the demonstrations. Rerun with the same --out to
resume: only episodes without a record run again."""
from __future__ import annotations

import os
from pathlib import Path

from cli.config_args import DEFAULT_CONFIG, config_from_args
from envs.split import select_tasks
from rl.config import ConfigError


def register(sub) -> None:
    p = sub.add_parser("harvest", help="episodes on the training split; passing ones become warm-start rows")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_CONFIG.name})")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.k=4 scaffold.name=native")
    p.add_argument("--run-dir", help="run whose training split is harvested (default: trainer.run_dir; "
                                     "its split is written there first if it has none)")
    p.add_argument("--out", help="harvest folder (default: <run-dir>/harvest)")
    p.add_argument("--base-url", help="another OpenAI-compatible endpoint (…/v1); default: serve model.path here")
    p.add_argument("--model", help="the endpoint's model name (required with --base-url)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the endpoint's key")
    p.add_argument("-k", type=int, help="episodes per task (default eval.k)")
    p.add_argument("--side", choices=("demo", "train"), default="demo",
                   help="which training tasks: the demonstrated ones (default), or those calibration and GRPO "
                        "use (with task.band_file, the band): a rejection-sampling round on GRPO's own tasks")
    p.set_defaults(func=harvest_command)


def harvest_command(args) -> int:
    cfg = config_from_args(args)
    if args.base_url and not args.model:
        raise ConfigError("--base-url needs --model (the name the endpoint serves)")
    if args.k:
        cfg.eval.k = args.k
    cfg.eval.scaffold = cfg.scaffold.name      # harvest in the scaffold the run trains in
    run_dir = Path(args.run_dir or cfg.trainer.run_dir)
    out = Path(args.out or run_dir / "harvest")
    tasks = select_tasks(cfg.task, cfg.trainer.seed, run_dir, args.side)
    import ray  # heavy: only once the config is good

    from orchestrator.cluster import run_evaluator, spawn_env_actors, start_policy, start_recording_proxy

    if args.base_url:
        server, base_url = start_recording_proxy(cfg, args.base_url, args.model, os.environ.get(args.api_key_env))
        model_id = args.model
    else:
        server, base_url = start_policy(cfg)
        model_id = cfg.eval.model_id
    env_actors = spawn_env_actors(cfg, tasks=tasks)
    print(f"[rlvr harvest] {len(tasks)} training tasks x k={cfg.eval.k} via {cfg.scaffold.name} "
          f"against {args.base_url or cfg.model.path} -> {out}", flush=True)
    summary = run_evaluator(cfg, str(out), tasks, base_url, model_id, env_actors, server, harvest=True)
    h = summary["harvest"]
    print(f"[rlvr harvest] {h['rows']} rows from {h['tasks']} of {len(tasks)} tasks; add "
          f"warm_start.harvest_dirs=[{out}] to train on them")
    ray.get([a.shutdown.remote() for a in env_actors])
    ray.get(server.shutdown.remote())
    return 0
