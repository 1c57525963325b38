"""The warm-start stage: demonstrations for the training split -> serving-format rows -> SFT
-> a merged model folder. Every part is resumable: demonstrations append to a durable JSONL
(a killed run rebuilds only the missing ones), SFT resumes from its checkpoint, and a
finished folder is reused as is.

    model_dir = warm_start(cfg, run_dir, train_tasks)   # cfg.model.path for the GRPO stage
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from actors.chat_format import conversation_calls
from envs.split import select_tasks
from envs.tasks import Task
from orchestrator.harvest import harvest_rows
from rl.assembly import assemble
from rl.config import RunConfig
from rl.default_model import resolve_model_path
from rl.jsonl import append_durable, read_complete
from rl.sft import run_sft
from scaffolds.demos import build_demonstration

DEMOS_FILE = "demos.jsonl"


def build_demos(cfg: RunConfig, tasks: list[Task], out: Path, workers: int = 2) -> list[dict]:
    """Demonstrations for `tasks` (the training split only), `demos_per_task` each, a share
    of them recoveries; every attempt is recorded (kept or not) so a rerun skips it."""
    ws = cfg.warm_start
    done = {(r["task_id"], r["seed"]) for r in read_complete(out)}
    todo = [(t, k) for t in tasks for k in range(ws.demos_per_task) if (t.id, k) not in done]
    lock, slots = threading.Lock(), list(range(workers))
    n_recovery = round(ws.demos_per_task * ws.recovery_fraction)
    started, finished = time.monotonic(), [0]
    print(f"[demos] {len(todo)} to build ({len(done)} done) for {len(tasks)} tasks", flush=True)

    def one(item):
        task, k = item
        with lock:
            slot = slots.pop()
        try:
            demo = build_demonstration(task, cfg.env, uid=cfg.env.sandbox_uid_base + slot, seed=k,
                                       recovery=k < n_recovery)
            record = (asdict(demo) if demo is not None else
                      {"task_id": task.id, "seed": k, "variant": "recovery", "reward": None,
                       "messages": [], "notes": ["not buildable from what the model sees (see build_demonstration)"]})
            append_durable(out, [record])
        finally:
            with lock:
                slots.append(slot)
                finished[0] += 1
                if finished[0] % 10 == 0 or finished[0] == len(todo):
                    print(f"[demos] {finished[0]}/{len(todo)} in {time.monotonic() - started:.0f} s", flush=True)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, todo))
    return read_complete(out)


def sft_rows(tokenizer, demos: list[dict]) -> list[dict]:
    """Serving-format rows of the kept demonstrations (reward 1.0)."""
    rows = []
    for d in demos:
        if d.get("reward") != 1.0:
            continue
        for s in assemble(conversation_calls(tokenizer, d["messages"], d["tools"])).samples:
            rows.append({"input_ids": s.token_ids, "assistant_masks": s.loss_mask, "task_id": d["task_id"]})
    return rows


def warm_start(cfg: RunConfig, folder: Path, train_tasks: list[Task], demos_only: bool = False) -> Path:
    """Demonstrations for `train_tasks` into `folder`, then SFT; returns the merged model folder
    (or the demonstrations file with `demos_only`). Reuses whatever a killed run finished."""
    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    base = resolve_model_path(cfg.model.path)
    demos = build_demos(cfg, train_tasks, folder / DEMOS_FILE) if cfg.warm_start.demos else []
    if demos_only:
        return folder / DEMOS_FILE
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = sft_rows(tokenizer, demos)
    kept = {d["task_id"] for d in demos if d.get("reward") == 1.0}
    print(f"[warm-start] {len(rows)} demonstration rows from {len(kept)} of {len(train_tasks)} demonstrated tasks",
          flush=True)
    train_ids = {t.id for t in train_tasks}
    for hdir in cfg.warm_start.harvest_dirs:
        harvested = harvest_rows(hdir, cfg.warm_start.max_assistant_turns)
        foreign = sorted({r["task_id"] for r in harvested} - train_ids)
        if foreign:   # a harvest of another split would train on held-out tasks
            raise ValueError(f"harvest {hdir} holds tasks outside this run's demonstrated tasks: {foreign[:3]} "
                             "(a harvest of another split, or of the tasks kept for calibration and GRPO)")
        rows += harvested
        print(f"[warm-start] {len(harvested)} harvested rows from {hdir}", flush=True)
    return run_sft(rows, base, cfg.warm_start, folder / "sft", cfg.model)


def folder_for(cfg: RunConfig, run_dir: Path) -> Path:
    return Path(cfg.warm_start.dir) if cfg.warm_start.dir else Path(run_dir) / "warm_start"


def run_warm_start(cfg: RunConfig, run_dir: Path, demos_only: bool = False) -> Path:
    """The warm-start stage of `run_dir`: its split is written there first (as training will
    find it), and only its demo side is demonstrated (the whole training side unless
    task.demo_fraction sets tasks apart for calibration and GRPO)."""
    train_tasks = select_tasks(cfg.task, cfg.trainer.seed, run_dir, "demo")
    return warm_start(cfg, folder_for(cfg, run_dir), train_tasks, demos_only=demos_only)
