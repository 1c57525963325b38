"""What a person watching the terminal sees: a progress bar over each step's episodes, one
line per finished step, a closing table with the run's files, and on failure the tail of the
actors' logs (which otherwise stay in <run_dir>/logs; `logging.console: debug` streams them).
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator.metrics import DASHBOARD_KEYS, first_last_change, top_time_parts
from orchestrator.tracker import tensorboard_dir

FAILURE_TAIL_LINES = 40


def summary_line(step: int, total_steps: int, elapsed_s: float, metrics: dict) -> str:
    shown = " ".join(f"{k}={metrics[k]:.3g}" for k in DASHBOARD_KEYS
                     if isinstance(metrics.get(k), (int, float)) and not isinstance(metrics.get(k), bool))
    if top := top_time_parts(metrics):
        shown += f" | time: {top}"
    return f"[step {step}/{total_steps} | {elapsed_s:.0f}s] {shown}"


class Console:
    def __init__(self, total_steps: int, progress: bool = True, stream=None):
        self.total_steps = total_steps
        self.progress_on = progress
        self.stream = stream or sys.stderr
        self._t0 = time.time()

    @contextlib.contextmanager
    def progress(self, step: int, total: int, done: int = 0) -> Iterator[Callable]:
        """A bar over the step's episodes (done/total, tokens/s, reward so far); yields the
        per-episode callback the rollout source calls from any thread. `done` episodes (a resumed
        step's, finished before) count from the start; the rate and reward are the new ones'."""
        from tqdm import tqdm

        desc = f"step {step}/{self.total_steps}" + (f" ({done} reused)" if done else "")
        bar = tqdm(total=total, initial=done, desc=desc, unit="ep",
                   file=self.stream, leave=True, dynamic_ncols=True, mininterval=1.0,
                   disable=not self.progress_on)
        lock, rewards, t0 = threading.Lock(), [], time.time()
        tokens = 0

        def episode_done(episode) -> None:
            nonlocal tokens
            with lock:
                rewards.append(episode.reward)
                tokens += episode.record.tokens
                bar.set_postfix_str(f"{tokens / max(time.time() - t0, 1e-9):.1f} tok/s, "
                                    f"reward {statistics.fmean(rewards):.3f}", refresh=False)
                bar.update(1)

        try:
            yield episode_done
        finally:
            bar.close()

    def step_done(self, step: int, metrics: dict) -> None:
        print(summary_line(step, self.total_steps, time.time() - self._t0, metrics), flush=True)

    def final_table(self, run_dir: Path, records: list[dict]) -> None:
        print(final_table(run_dir, records, time.time() - self._t0), flush=True)


def final_table(run_dir: str | Path, records: list[dict], elapsed_s: float) -> str:
    """The run in a few rows: steps, reward first -> last (best), and where its files are."""
    run_dir = Path(run_dir)
    rows = [("run", f"{run_dir} ({len(records)} step(s) logged, {elapsed_s:.0f} s this session)")]
    rewards = [(r["step"], r["reward_mean"]) for r in records if isinstance(r.get("reward_mean"), (int, float))]
    if rewards:
        best = max(rewards, key=lambda sr: sr[1])
        rows.append(("reward_mean", f"{rewards[0][1]:.3f} (step {rewards[0][0]}) -> {rewards[-1][1]:.3f} "
                                    f"(step {rewards[-1][0]}); best {best[1]:.3f} at step {best[0]}"))
    band = band_change(records)
    if band:
        rows.append(("band reward", band))
    ckpts = sorted((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").is_dir() else []
    files = [("metrics", run_dir / "metrics.jsonl"), ("plot", run_dir / "reward_curve.png"),
             ("trace", run_dir / "trace.jsonl"),
             ("checkpoints", f"{run_dir / 'checkpoints'} (last: {ckpts[-1].name})" if ckpts else None),
             ("actor logs", run_dir / "logs"),
             ("tensorboard", f"{tensorboard_dir(run_dir)} (view: rlvr monitor {run_dir})"
              if tensorboard_dir(run_dir).is_dir() else None)]
    rows += [(k, str(v)) for k, v in files if v is not None and (not isinstance(v, Path) or v.exists())]
    width = max(len(k) for k, _ in rows)
    rule = "-" * (width + 2 + max(len(v) for _, v in rows))
    return "\n".join([rule, *(f"{k.ljust(width)}  {v}" for k, v in rows), rule])


def band_change(records: list[dict], n: int = 3) -> str | None:
    """The band's mean reward (each step's fixed draws, unrescued) over the first n steps against
    the last n (fewer where the run is shorter than 2n steps, at least 2), with the standard error
    of that difference from the steps' own spread (which holds both the sampling noise and the
    change of task from step to step)."""
    vals = [r["band/reward_mean"] for r in records if isinstance(r.get("band/reward_mean"), (int, float))]
    change = first_last_change(vals, n)
    if change is None:
        return None
    n, first, last, se = change
    return (f"first {n} steps {first:.3f} -> last {n} {last:.3f} "
            f"({last - first:+.3f} +- {se:.3f} s.e. from the steps' spread)")


def actor_log_tails(run_dir: str | Path, lines: int = FAILURE_TAIL_LINES) -> str:
    """The last lines of every actor log of a run: what a failed run shows on the console."""
    logs = sorted((Path(run_dir) / "logs").glob("*.log"))
    parts = []
    for log in logs:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"==> {log} (last {len(tail)} lines) <==\n" + "\n".join(tail))
    return "\n".join(parts)
