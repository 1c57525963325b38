"""`rlvr best-of-n`: N pi rollouts on sandboxed copies of a repository; the repository's own
tests pick the winner, whose diff is printed (and optionally kept)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from envs.sandbox import Sandbox, chown_tree
from rl.config import load_config
from scaffolds.base import EpisodeOutcome
from scaffolds.pi.episode import run_pi_episode
from scaffolds.pi.launch import SandboxLauncher
from scaffolds.system_prompt import CODING_SYSTEM_PROMPT


def register(sub) -> None:
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


@dataclass
class Rollout:
    """One best-of-n rollout: its checkout, pi's outcome and the repository tests' verdict."""
    index: int
    checkout: Path
    outcome: EpisodeOutcome
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
              work: Path, uid_base: int = 62000) -> list[Rollout]:
    """N sandboxed copies of repo, one pi rollout each, then the repo's tests in each copy."""
    def one(i: int) -> Rollout:
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
        return Rollout(i, checkout, outcome, score, tests)

    with ThreadPoolExecutor(max_workers=max(1, min(n, cfg.eval.parallel or n))) as pool:
        return list(pool.map(one, range(n)))


def repo_diff(original: Path, changed: Path) -> str:
    res = subprocess.run(["diff", "-ruN", "--exclude=__pycache__", "--exclude=.git", "--exclude=.pytest_cache",
                          str(original), str(changed)], capture_output=True, text=True)
    if res.returncode > 1:
        raise RuntimeError(f"diff failed: {res.stderr.strip()}")
    return res.stdout


def best_of_n_command(args) -> int:
    cfg = load_config(args.config, args.overrides)
    repo = Path(args.repo).resolve()
    if not repo.is_dir():
        raise SystemExit(f"--repo {args.repo}: not a directory")
    if args.n < 1:
        raise SystemExit("-n must be at least 1")
    worker = None
    base_url = args.base_url
    if base_url is None:
        from orchestrator.cluster import start_policy  # heavy (ray, vLLM): only when serving here
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

