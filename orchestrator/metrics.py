"""Step metrics to their record and to the Ray dashboard: a JSONL file (always), and Ray's
metrics API (gauges `rlvr_*`, exported through the node's Prometheus endpoint). The live
trackers are orchestrator/tracker.py; the console line is orchestrator/console.py."""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from rl.jsonl import append_durable, read_complete, rewrite
from rl.types import EPISODE_TIME_PARTS, EpisodeRecord

DASHBOARD_KEYS = ("reward_mean", "reward_std", "frac_reward_zero_std", "gen_tokens_per_s",
                  "time_rollout_s", "time_learn_s", "time_sync_s", "parity_gap",
                  "tools/failure_frequency", "tools/unparsed_calls", "clipped_ratio", "frac_edited", "loss",
                  "policy/entropy", "learner/tis_capped_frac")


@contextlib.contextmanager
def timed(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Adds the block's wall time to timings[f"time_{name}_s"]: a step reads as named phases."""
    t0 = time.time()
    try:
        yield
    finally:
        key = f"time_{name}_s"
        timings[key] = timings.get(key, 0.0) + time.time() - t0


def episode_rates(rows: list[dict]) -> dict[str, float]:
    """How fast episodes ran, from their records (dicts): each sequence's decode rate (generated
    tokens per second of the engine's decode time: low while the card idles means the engine's
    host loop is starved or over-batched) and the host's load per core at the episodes' ends."""
    out: dict[str, float] = {}
    decode = sum((r.get("time_budget") or {}).get("decode", 0.0) for r in rows)
    if decode > 0:
        out["rollout/seq_decode_tok_s"] = sum(r.get("tokens") or 0 for r in rows) / decode
    loads = [r["host_load"] for r in rows if r.get("host_load") is not None]
    if loads:
        out["rollout/host_load_per_core"] = sum(loads) / len(loads)
    return out


def step_time_budget(records: list[EpisodeRecord], rollout_s: float, phases: dict[str, float]) -> dict[str, float]:
    """Where a step's wall time went, as `time/<part>_s` keys that add up to the step.

    The rollout's wall time is shared among the episode parts (rl.types.EPISODE_TIME_PARTS)
    in proportion to the episode-seconds each took (episodes overlap, so their raw sums
    exceed the wall); the driver's own phases (learn, sync, probe) are added as measured.
    With trainer.rollout_ahead the rollout ran beside the previous step's learning: its parts
    then overlap that learning, and `time/rollout_wait_s` is what it cost the step beyond it.
    Also: prefix-cache hit rate and the mean number of episodes in flight.
    """
    out: dict[str, float] = {}
    budgets = [r.time_budget for r in records if r.time_budget]
    total = sum(sum(b.values()) for b in budgets)
    if budgets and total > 0:
        for part in EPISODE_TIME_PARTS:
            out[f"time/{part}_s"] = rollout_s * sum(b.get(part, 0.0) for b in budgets) / total
        out["rollout/episodes_in_flight"] = sum(r.seconds or 0.0 for r in records) / max(rollout_s, 1e-9)
    else:  # single-turn rollouts keep no per-episode budget: the rollout is one part
        out["time/rollout_s"] = rollout_s
    out.update(episode_rates([vars(r) for r in records]))
    prompt = sum(r.prompt_tokens or 0 for r in records)
    if prompt:
        out["rollout/prefix_cache_hit_rate"] = sum(r.cached_tokens or 0 for r in records) / prompt
    for name in ("rollout_wait", "learn", "sync", "probe"):
        if f"time_{name}_s" in phases:
            out[f"time/{name}_s"] = phases[f"time_{name}_s"]
    return out


def top_time_parts(metrics: dict, k: int = 3) -> str:
    """The k largest `time/` parts of a step, e.g. "decode 41% prefill 22% learn 15%"."""
    parts = {key[5:-2]: v for key, v in metrics.items() if key.startswith("time/") and isinstance(v, (int, float))}
    total = sum(parts.values())
    if total <= 0:
        return ""
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:k]
    return " ".join(f"{name} {100 * v / total:.0f}%" for name, v in top)


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


def first_last_change(vals: list[float], n: int = 3) -> tuple[int, float, float, float] | None:
    """A per-step series' first n against its last n (fewer where it is shorter than 2n, at least 2):
    (n, first mean, last mean, standard error of their difference from the steps' own spread);
    None when the series is too short to compare."""
    n = min(n, len(vals) // 2)
    if n < 2:
        return None
    first, last = vals[:n], vals[-n:]
    se = (statistics.variance(first) / n + statistics.variance(last) / n) ** 0.5
    return n, statistics.fmean(first), statistics.fmean(last), se

