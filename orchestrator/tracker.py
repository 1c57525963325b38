"""Live trackers beside metrics.jsonl (the record, always written by MetricsLog).

`logging.backends` picks them; today TensorBoard, which `rlvr monitor RUN_DIR` serves. Every
numeric key of a step's metrics becomes a scalar (whatever keys the loop adds, time budgets
included; nested dicts by `a/b` paths), and a few episodes of each step are written as text:
the task, the reward and why, and the transcript the policy produced.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rl.config import LoggingConfig

TRANSCRIPT_CHARS = 6000  # per sample episode; the tail is kept (the last turns say how it ended)


def tensorboard_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "tensorboard"


def scalars(metrics: dict, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) for every finite number in metrics, nested dicts flattened to `a/b`."""
    for key, value in metrics.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from scalars(value, f"{tag}/")
        elif isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            yield tag, float(value)


def episode_text(episode, decode: Callable[[list[int]], str]) -> str:
    """One episode as Markdown: what it was, what it scored and why, what the policy wrote."""
    r = episode.record
    why = {k: v for k, v in (("stop", r.stop_reason), ("reward parts", r.reward_parts), ("error", r.error),
                              ("reward error", r.reward_error), ("flags", r.reward_flags),
                              ("unparsed tool calls", r.unparsed_tool_calls)) if v}
    head = [f"**task** `{r.task or episode.group_id}` · **reward** {r.reward:.3f} · **tokens** {r.tokens}"
            + (f" · **tool calls** {r.tool_calls} ({r.tool_failures} failed)" if r.agentic else "")
            + (" · clipped" if r.clipped else "")]
    head += [f"- {k}: `{v}`" for k, v in why.items()]
    transcript = decode(episode.sequences[-1].token_ids) if episode.sequences else ""
    if len(transcript) > TRANSCRIPT_CHARS:
        transcript = "…" + transcript[-TRANSCRIPT_CHARS:]
    # TensorBoard renders Markdown; four-space indentation keeps the transcript verbatim
    return "\n".join(head) + "\n\n" + "\n".join("    " + line for line in transcript.splitlines())


def pick_samples(episodes: list, n: int) -> list:
    """The best and the worst episodes first (the contrast GRPO learns from), then the rest."""
    ranked = sorted(episodes, key=lambda e: e.reward, reverse=True)
    order, lo, hi = [], 0, len(ranked) - 1
    while lo <= hi and len(order) < n:
        order.append(ranked[lo])
        if lo != hi and len(order) < n:
            order.append(ranked[hi])
        lo, hi = lo + 1, hi - 1
    return order


class Tracker:
    def __init__(self, cfg: LoggingConfig, run_dir: str | Path):
        self.cfg = cfg
        self.writer = None
        if "tensorboard" in cfg.backends:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            # one TensorBoard "run" per training run, named like its folder
            self.writer = SummaryWriter(log_dir=str(tensorboard_dir(run_dir) / Path(run_dir).resolve().name),
                                        flush_secs=10)

    def log_step(self, step: int, metrics: dict) -> None:
        if self.writer is None:
            return
        for tag, value in scalars(metrics):
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a viewer open during the run sees the step at once

    def log_episodes(self, step: int, episodes: Iterable, decode: Callable[[list[int]], str]) -> None:
        if self.writer is None or self.cfg.sample_episodes == 0:
            return
        for i, episode in enumerate(pick_samples(list(episodes), self.cfg.sample_episodes)):
            self.writer.add_text(f"episodes/sample_{i}", episode_text(episode, decode), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
