"""The CPU learner's resident memory on a run's recorded episodes: per phase, per step, and
step over step, for an earlier commit and this checkout side by side in one run.

Each variant replays the run's stored steps in order (the episodes as the loop trains them:
group advantages, zero-advantage samples dropped) through the project's Learner, one optimizer
step per stored step, in a fresh process of its own (a clean high-water mark and a clean heap).
Inside a step, every phase -- the decoder's forward, the LM-head log-probs, backward, the
optimizer, and what lies between (a micro-batch's set-up, the GRPO terms, clipping) -- gets the
peak resident memory it reached (Linux's VmHWM, reset at each phase boundary). After each step
the resident memory and glibc's heap (bytes in use, bytes free but kept) are read: a heap whose
free share grows step over step is fragmentation, not tensors.

Variants are `;`-separated, each `name=side[:key=value,...]`: side `base` runs the learner of the commit given with
--base (a `git worktree` of it), `this` the learner of this checkout; a key in upper case is an
environment variable of the variant's process (MALLOC_ARENA_MAX=2), `config` a config file whose
learner section the variant takes instead of the run's (that side's configs/default.yaml), any
other a LearnerConfig field (gradient_checkpointing=true).

    python -m bench.learner_rss runs/default --base main \\
        --variants "before=base;before+ckpt=base:gradient_checkpointing=true;after=this:config=configs/default.yaml" \\
        --json docs/results/learner_rss_cpu.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


# ---- the measuring side (runs in each variant's process, importing that side's project) ------

def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap() -> dict:
    """glibc's view of the heap: bytes handed out, bytes free but kept (fragmentation), mmapped."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return {"heap_in_use_gib": (m.uordblks + m.hblkhd) / GIB, "heap_free_kept_gib": m.fordblks / GIB,
            "heap_mmapped_gib": m.hblkhd / GIB}


class Phases:
    """Peak RSS per phase: each wrapped call credits the high-water mark reached so far to the
    phase it interrupts, resets it, and on return credits its own; calls nest."""

    def __init__(self):
        self.peaks: dict[str, float] = {}
        self.stack = ["between"]

    def _credit(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), _status("VmHWM") / GIB)
        _reset_hwm()

    def wrap(self, obj, attr: str, phase: str, when=lambda *a, **k: True) -> None:
        fn = getattr(obj, attr)

        def measured(*args, **kwargs):
            if not when(*args, **kwargs):
                return fn(*args, **kwargs)
            self._credit(self.stack[-1])
            self.stack.append(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self._credit(self.stack.pop())

        setattr(obj, attr, measured)

    def take(self) -> dict[str, float]:
        self._credit(self.stack[-1])
        out, self.peaks = self.peaks, {}
        return out


def load_steps(run_dir: Path, steps: int | None) -> list[list]:
    """Each stored step's training samples, as the loop builds them (orchestrator.loop._to_samples)."""
    from orchestrator.rollouts.base import Episode
    from rl.advantages import group_advantages
    from rl.jsonl import read_complete
    from rl.types import TrainSample

    out = []
    for path in sorted((run_dir / "episodes").glob("step_*.jsonl"))[:steps]:
        episodes = [Episode.from_json(e) for line in read_complete(path) for e in line]
        adv = group_advantages([e.reward for e in episodes], [e.group_id for e in episodes])
        samples = [TrainSample(s.token_ids, s.loss_mask, s.logprobs, advantage=a, group_id=e.group_id)
                   for e, a in zip(episodes, adv) for s in e.sequences if a != 0]
        if samples:
            out.append(samples)
    return out


def worker(args) -> None:
    import torch

    from actors.learner import Learner
    from rl.config import load_config

    cfg = load_config(Path(args.run) / "config.yaml", [])
    fields = json.loads(args.learner_overrides)
    own = load_config(fields.pop("config"), []).learner if "config" in fields else cfg.learner
    lcfg = type(own)(**{**own.model_dump(), **{k: _parse(v, getattr(own, k)) for k, v in fields.items()}})
    from modeling.default_model import resolve_model_path
    path = resolve_model_path(cfg.model.path)
    steps = load_steps(Path(args.run), args.steps) * args.repeat
    phases = Phases()
    emit({"event": "start", "rss_gib": _status("VmRSS") / GIB, "learner": lcfg.model_dump(),
          "env": {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "OMP_", "MKL_"))}})
    learner = Learner(path, lcfg, cfg.model, seed=0, lora=cfg.lora)
    phases.wrap(learner, "_hidden", "forward", when=lambda *a, **k: torch.is_grad_enabled())
    phases.wrap(learner, "_target_logprobs", "lm_head_logprobs", when=lambda *a, **k: torch.is_grad_enabled())
    phases.wrap(learner, "_backward", "backward")
    phases.wrap(learner.optimizer, "step", "optimizer")
    emit({"event": "built", "rss_gib": _status("VmRSS") / GIB, **heap()})
    for i, samples in enumerate(steps, 1):
        before = _status("VmRSS") / GIB
        phases.take()
        t0 = time.perf_counter()
        out = learner.train_step(samples)
        seconds = time.perf_counter() - t0
        peaks = phases.take()
        emit({"event": "step", "step": i, "samples": len(samples), "tokens": sum(len(s.token_ids) for s in samples),
              "longest": max(len(s.token_ids) for s in samples), "seconds": seconds, "loss": out["loss"],
              "rss_before_gib": before, "rss_after_gib": _status("VmRSS") / GIB,
              "peak_gib": max(peaks.values()), "phase_peak_gib": peaks, **heap()})


def _parse(text: str, current):
    if isinstance(current, bool):
        return text.lower() in ("1", "true", "yes")
    if current is None:
        return None if text.lower() in ("none", "null") else float(text)
    return type(current)(text)


def emit(obj: dict) -> None:
    print("@@" + json.dumps(obj), flush=True)


# ---- the driving side -------------------------------------------------------------------------

def parse_variant(spec: str) -> dict:
    name, _, rest = spec.partition("=")
    side, _, pairs = rest.partition(":")
    if side not in ("base", "this") or not name:
        raise SystemExit(f"variant {spec!r}: expected name=base|this[:key=value,...]")
    env, fields = {}, {}
    for pair in filter(None, pairs.split(",")):
        key, _, value = pair.partition("=")
        (env if key.isupper() else fields)[key] = value
    return {"name": name, "side": side, "env": env, "fields": fields}


def run_variant(v: dict, tree: Path, args) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1", **v["env"]}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--run", str(Path(args.run).resolve()),
           "--learner-overrides", json.dumps(v["fields"]), "--repeat", str(args.repeat)] + (["--steps", str(args.steps)] if args.steps else [])
    rows = []
    with tempfile.TemporaryFile("w+") as err, subprocess.Popen(cmd, cwd=tree, stdout=subprocess.PIPE, stderr=err,
                                                               text=True, env=env) as proc:
        for line in proc.stdout:  # as they come: a variant that dies keeps the steps it finished
            if line.startswith("@@"):
                rows.append({"variant": v["name"], **json.loads(line[2:])})
                print(json.dumps({k: x for k, x in rows[-1].items() if k != "learner"}), flush=True)
        proc.wait()
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0:
        rows.append({"variant": v["name"], "event": "error", "returncode": proc.returncode, "stderr": stderr[-3000:]})
        print(f"variant {v['name']} exited {proc.returncode}:\n{stderr[-3000:]}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    steps = [r for r in rows if r["event"] == "step"]
    phases = sorted({p for r in steps for p in r["phase_peak_gib"]})
    lines = ["| variant | step | samples | tokens (longest) | s | peak GiB | " + " | ".join(phases)
             + " | RSS after | heap in use | heap free kept |",
             "|---|---|---|---|---|---|" + "---|" * len(phases) + "---|---|---|"]
    for r in steps:
        cells = " | ".join(f"{r['phase_peak_gib'].get(p, 0):.2f}" for p in phases)
        lines.append(f"| {r['variant']} | {r['step']} | {r['samples']} | {r['tokens']} ({r['longest']}) | "
                     f"{r['seconds']:.1f} | {r['peak_gib']:.2f} | {cells} | {r['rss_after_gib']:.2f} | "
                     f"{r['heap_in_use_gib']:.2f} | {r['heap_free_kept_gib']:.2f} |")
    lines.append("")
    lines.append("| variant | max peak GiB | last RSS GiB | total s | loss of each step |")
    lines.append("|---|---|---|---|---|")
    for name in dict.fromkeys(r["variant"] for r in steps):
        mine = [r for r in steps if r["variant"] == name]
        lines.append(f"| {name} | {max(r['peak_gib'] for r in mine):.2f} | {mine[-1]['rss_after_gib']:.2f} | "
                     f"{sum(r['seconds'] for r in mine):.0f} | "
                     + " ".join(f"{r['loss']:.5f}" for r in mine) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", nargs="?", help="a run directory (its config.yaml and episodes/)")
    ap.add_argument("--base", default="HEAD~1", help="the commit the `base` side runs")
    ap.add_argument("--variants", default="before=base;after=this", help="name=side[:key=value,...];...")
    ap.add_argument("--steps", type=int, default=None, help="replay only the first N stored steps")
    ap.add_argument("--repeat", type=int, default=1, help="replay the stored steps this many times over (growth)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run", dest="run_opt", help=argparse.SUPPRESS)
    ap.add_argument("--learner-overrides", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.run = args.run_opt
        worker(args)
        return
    if not args.run or not (Path(args.run) / "config.yaml").is_file():
        raise SystemExit(f"{args.run}: not a run directory (no config.yaml)")
    variants = [parse_variant(s) for s in args.variants.split(";")]
    trees = {"this": ROOT}
    if any(v["side"] == "base" for v in variants):
        trees["base"] = Path(tempfile.mkdtemp(prefix="bench-rss-base-")) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(trees["base"]), args.base], cwd=ROOT, check=True,
                       capture_output=True)
    rows, load = [], []
    try:
        for v in variants:
            load.append(os.getloadavg()[0])
            rows += run_variant(v, trees[v["side"]], args)
    finally:
        if "base" in trees:
            subprocess.run(["git", "worktree", "remove", "--force", str(trees["base"])], cwd=ROOT,
                           capture_output=True)
    text = table(rows)
    print(text)
    print(f"load average at each variant's start: {', '.join(f'{x:.1f}' for x in load)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"run": str(args.run), "base": args.base, "variants": variants,
                                         "load_avg_at_start": load, "rows": rows, "table": text}, indent=1))


if __name__ == "__main__":
    main()
