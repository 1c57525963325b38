"""Step metrics to three sinks: a JSONL file (the record), the console (progress) and the
Ray dashboard (Ray's metrics API, exported through the node's Prometheus endpoint)."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

DASHBOARD_KEYS = ("reward_mean", "reward_std", "frac_reward_zero_std", "gen_tokens_per_s",
                  "time_rollout_s", "time_learn_s", "time_sync_s", "parity_gap",
                  "tools/failure_frequency", "clipped_ratio", "frac_edited", "loss")


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
        self._t0 = time.time()

    def truncate_after(self, step: int) -> None:
        """On resume: drop records of steps past the checkpoint (and a torn last line)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("step", math.inf) <= step:
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(l + "\n" for l in kept))
        os.replace(tmp, self.path)

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, "time": time.time(), **metrics}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for key, gauge in self._gauges.items():
            value = metrics.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                gauge.set(float(value), tags=self._run_tag)
        shown = " ".join(f"{k}={metrics[k]:.3g}" for k in DASHBOARD_KEYS if isinstance(metrics.get(k), (int, float)))
        print(f"[step {step}/{self.total_steps} | {time.time() - self._t0:.0f}s] {shown}", flush=True)


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
