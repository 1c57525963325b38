"""`rlvr eval`, `rlvr eval-report` and `rlvr best-of-n`."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a served policy on held-out tasks (k samples each, resumable)")
    p.add_argument("--config", help="run YAML (defaults apply without one)")
    p.add_argument("--run-dir", help="a training run: evaluate its held-out split (refuses trained-on tasks)")
    p.add_argument("--adapter", help="LoRA adapter folder to serve on top of model.path")
    p.add_argument("--out", help="output dir (default eval.out_dir); rerun with the same one to resume")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.k=3 eval.max_tasks=5")
    p.set_defaults(func=eval_command)

    r = sub.add_parser("eval-report", help="recompute an evaluation's summary, table and plot from its raw records")
    r.add_argument("out_dir")
    r.set_defaults(func=report_command)

    b = sub.add_parser("best-of-n", help="run N pi rollouts on copies of a repo; keep the one whose tests pass best")
    b.add_argument("--repo", required=True, help="repository directory (left untouched)")
    b.add_argument("--task", required=True, help="what the agent should do")
    b.add_argument("--test-cmd", required=True, help="shell command that runs the repo's tests, e.g. 'python -m pytest -q'")
    b.add_argument("-n", type=int, default=3, help="number of rollouts (default 3)")
    b.add_argument("--base-url", help="OpenAI-compatible server (…/v1); default: serve the config's model here")
    b.add_argument("--model", default=None, help="model id to ask the server for (default eval.model_id)")
    b.add_argument("--config", help="run YAML for the served model and limits")
    b.add_argument("--keep", help="copy the winning checkout here")
    b.add_argument("overrides", nargs="*")
    b.set_defaults(func=best_of_n_command)


# --- rlvr eval ---------------------------------------------------------------------------
def _tasks_file(cfg) -> Path:
    from envs.tasks import resolve_tasks_file
    try:
        return resolve_tasks_file(cfg.task.tasks_file, cfg.task.library)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None


def held_out_tasks(cfg, out_dir: Path, run_dir: str | None) -> list:
    """The run's held-out tasks: from a training run's split, or the split training would write."""
    from envs.split import assert_not_trained_on, load_split, write_split
    from envs.tasks import load_tasks

    tasks = load_tasks(_tasks_file(cfg))
    if cfg.task.max_tasks:
        tasks = tasks[:cfg.task.max_tasks]
    if run_dir:
        test_ids = load_split(run_dir).test
        assert_not_trained_on(run_dir, test_ids)
    else:
        test_ids = write_split(out_dir, tasks, cfg.task.train_fraction, cfg.trainer.seed).test
    by_id = {t.id: t for t in tasks}
    missing = [i for i in test_ids if i not in by_id]
    if missing:
        raise SystemExit(f"held-out task {missing[0]!r} is not in {_tasks_file(cfg)}; evaluate with the "
                         "task file the run was split from")
    chosen = [by_id[i] for i in test_ids]
    return chosen[:cfg.eval.max_tasks] if cfg.eval.max_tasks else chosen


def latest_adapter(run_dir: str) -> str | None:
    """The LoRA adapter a training run last synced to its rollout workers, if any."""
    adapters = sorted((Path(run_dir) / "adapters").glob("step_*"))
    if adapters:
        print(f"[eval] serving the trained adapter {adapters[-1]}", flush=True)
        return str(adapters[-1])
    return None


def start_policy(cfg, adapter: str | None = None):
    """A RolloutWorker serving the config's model (plus an optional LoRA adapter): (handle, base_url)."""
    import ray

    from actors.rollout_worker import RolloutWorker
    from rl.default_model import resolve_model_path
    from rl.ray_setup import actor_env, connect

    connect(cfg)
    worker = ray.remote(RolloutWorker).options(
        num_cpus=cfg.rollout.num_cpus, num_gpus=cfg.rollout.num_gpus,
        runtime_env=actor_env(cfg, max(1, int(cfg.rollout.num_cpus)))).remote(
        resolve_model_path(cfg.model.path), cfg.rollout, cfg.model, adapter is not None, cfg.learner.lora_rank)
    if adapter:
        ray.get(worker.load_lora_adapter.remote(str(Path(adapter).resolve())))
    return worker, ray.get(worker.start_server.remote())


def eval_command(args) -> int:
    import ray

    from actors.env_actor import EnvActor
    from actors.evaluator import make_evaluator
    from rl.config import load_config
    from rl.eval_report import render_markdown

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out or cfg.eval.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = held_out_tasks(cfg, out, args.run_dir)
    if not tasks:
        raise SystemExit("no held-out tasks to evaluate (check task.max_tasks / task.train_fraction)")
    adapter = args.adapter or (latest_adapter(args.run_dir) if args.run_dir else None)
    merged = Path(args.run_dir or "", "merged_weights")
    if args.run_dir and adapter is None and (merged / "config.json").is_file():
        print(f"[eval] serving the trained merged weights {merged}", flush=True)
        cfg.model.path = str(merged)
    worker, base_url = start_policy(cfg, adapter)
    env_actors = [ray.remote(EnvActor).options(num_cpus=cfg.env.num_cpus, max_concurrency=cfg.env.pool_size + 1)
                  .remote(cfg.env) for _ in range(cfg.env.num_env_actors)]
    evaluator = make_evaluator(cfg, str(out))
    summary = ray.get(evaluator.run.remote(tasks, base_url, cfg.eval.model_id, env_actors, worker))
    print(render_markdown(summary, f"{cfg.eval.scaffold} eval (k={cfg.eval.k})"))
    print(f"[rlvr eval] raw records, summary.json, report.md, report.png in {out}")
    ray.get([a.shutdown.remote() for a in env_actors])
    ray.get(worker.shutdown.remote())
    return 0


def report_command(args) -> int:
    from rl.eval_report import render_markdown, write_report
    summary = write_report(args.out_dir)
    print(render_markdown(summary))
    return 0


# --- rlvr best-of-n ------------------------------------------------------------------------
@dataclass
class Candidate:
    index: int
    checkout: Path
    outcome: object
    score: float
    tests: str           # e.g. "5 passed, 1 failed" or "exit 0"


_COUNT = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def score_tests(exit_code: int, output: str) -> tuple[float, str]:
    """Fraction of tests passing from pytest's summary line; else all-or-nothing on the exit code."""
    counts = {"passed": 0, "failed": 0, "error": 0}
    found = False
    for n, kind in _COUNT.findall(output[-4000:]):
        counts["error" if kind.startswith("error") else kind] += int(n)
        found = True
    total = sum(counts.values())
    if found and total:
        frac = counts["passed"] / total
        return (1.0 if exit_code == 0 and frac == 1.0 else min(frac, 0.999)), \
            ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    return (1.0 if exit_code == 0 else 0.0), f"exit {exit_code}"


def best_of_n(repo: Path, task: str, test_cmd: str, n: int, base_url: str, model_id: str, cfg,
              work: Path, uid_base: int = 62000) -> list[Candidate]:
    """N sandboxed copies of repo, one pi rollout each, then the repo's tests in each copy."""
    from envs.sandbox import Sandbox, chown_tree
    from scaffolds.pi_agent import SandboxLauncher, run_pi_episode
    from scaffolds.system_prompt import CODING_SYSTEM_PROMPT

    def one(i: int) -> Candidate:
        checkout = work / f"copy-{i}"
        shutil.copytree(repo, checkout, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".pi"))
        chown_tree(checkout, uid_base + i)
        sandbox = Sandbox(checkout, uid=uid_base + i)
        outcome = run_pi_episode(SandboxLauncher(sandbox, cpu_s=int(cfg.scaffold.wall_clock_s) + 5), task,
                                 base_url, model_id, cfg.scaffold, context_window=cfg.rollout.max_model_len,
                                 max_tokens=cfg.rollout.max_tokens, system_prompt=CODING_SYSTEM_PROMPT,
                                 events_path=work / f"events-{i}.jsonl", checkout=checkout)
        result = sandbox.run(test_cmd, timeout_s=cfg.env.verify_timeout_s)
        score, tests = score_tests(result.exit_code, result.output)
        return Candidate(i, checkout, outcome, score, tests)

    with ThreadPoolExecutor(max_workers=max(1, min(n, cfg.eval.parallel or n))) as pool:
        return list(pool.map(one, range(n)))


def repo_diff(original: Path, changed: Path) -> str:
    res = subprocess.run(["diff", "-ruN", "--exclude=__pycache__", "--exclude=.git", "--exclude=.pytest_cache",
                          str(original), str(changed)], capture_output=True, text=True)
    if res.returncode > 1:
        raise RuntimeError(f"diff failed: {res.stderr.strip()}")
    return res.stdout


def best_of_n_command(args) -> int:
    from rl.config import load_config

    cfg = load_config(args.config, args.overrides)
    repo = Path(args.repo).resolve()
    if not repo.is_dir():
        raise SystemExit(f"--repo {args.repo}: not a directory")
    if args.n < 1:
        raise SystemExit("-n must be at least 1")
    worker = None
    base_url = args.base_url
    if base_url is None:
        worker, server = start_policy(cfg)
        base_url = f"{server}/episodes/best-of-n/v1"
    work = Path(tempfile.mkdtemp(prefix="rlvr-best-of-n-"))
    os.chmod(work, 0o755)
    try:
        cands = best_of_n(repo, args.task, args.test_cmd, args.n, base_url, args.model or cfg.eval.model_id,
                          cfg, work)
        for c in cands:
            o = c.outcome
            print(f"[best-of-n] rollout {c.index}: tests {c.tests} (score {c.score:.3f}); pi {o.stop_reason}, "
                  f"{o.turns} turns, {o.tool_calls} tool calls, {o.seconds:.0f}s")
        best = max(cands, key=lambda c: (c.score, -c.index))
        print(f"[best-of-n] keeping rollout {best.index}: {best.tests}")
        diff = repo_diff(repo, best.checkout)
        print(diff if diff else "(the kept rollout changed nothing)")
        if args.keep:
            shutil.copytree(best.checkout, args.keep, symlinks=True)
            print(f"[best-of-n] winning checkout copied to {args.keep}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if worker is not None:
            import ray
            ray.get(worker.shutdown.remote())
    return 0

