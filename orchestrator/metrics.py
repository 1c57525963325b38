"""Step metrics to their record and to the Ray dashboard: a JSONL file (always), and Ray's
metrics API (gauges `rlvr_*`, exported through the node's Prometheus endpoint). The live
trackers are orchestrator/tracker.py; the console line is orchestrator/console.py."""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

from rl.jsonl import append_durable, read_complete, rewrite

DASHBOARD_KEYS = ("reward_mean", "reward_std", "frac_reward_zero_std", "gen_tokens_per_s",
                  "time_rollout_s", "time_learn_s", "time_sync_s", "parity_gap",
                  "tools/failure_frequency", "tools/unparsed_calls", "clipped_ratio", "frac_edited", "loss")


@contextlib.contextmanager
def timed(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Adds the block's wall time to timings[f"time_{name}_s"]: a step reads as named phases."""
    t0 = time.time()
    try:
        yield
    finally:
        key = f"time_{name}_s"
        timings[key] = timings.get(key, 0.0) + time.time() - t0


class MetricsLog:
    def __init__(self, run_dir: Path, total_steps: int, use_ray_metrics: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.total_steps = total_steps
        self._gauges = {}
        if use_ray_metrics:
            from ray.util.metrics import Gauge
            self._gauges = {k: Gauge("rlvr_" + k.replace("/", "_"), description=f"agentic-rlvr {k}",
                                     tag_keys=("run",)) for k in DASHBOARD_KEYS}
        self._run_tag = {"run": Path(run_dir).name}

    def truncate_after(self, step: int) -> None:
        """On resume: drop records of steps past the checkpoint (and a torn last line)."""
        if self.path.exists():
            rewrite(self.path, [r for r in read_complete(self.path) if r.get("step", math.inf) <= step])

    def log(self, step: int, metrics: dict) -> None:
        append_durable(self.path, [{"step": step, "time": time.time(), **metrics}])
        for key, gauge in self._gauges.items():
            value = metrics.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                gauge.set(float(value), tags=self._run_tag)


def read_metrics(run_dir: str | Path) -> list[dict]:
    return read_complete(Path(run_dir) / "metrics.jsonl")
