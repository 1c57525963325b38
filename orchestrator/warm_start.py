"""The warm-start stage: demonstrations for the training split -> serving-format rows -> SFT
-> a merged model folder. Every part is resumable: demonstrations append to a durable JSONL
(a killed run rebuilds only the missing ones), SFT resumes from its checkpoint, and a
finished folder is reused as is.

    model_dir = warm_start(cfg, run_dir, train_tasks)   # cfg.model.path for the GRPO stage
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from envs.split import select_tasks
from envs.tasks import Task
from modeling.default_model import resolve_model_path
from modeling.sft import run_sft
from rl.config import RunConfig
from rl.jsonl import append_durable, read_complete

DEMOS_FILE = "demos.jsonl"
# demonstrations run as uids above the episode slots': an evaluation or calibration on the same
# host (env.sandbox_uid_base + i) would otherwise kill the demonstrations' processes, and they its
DEMO_UID_OFFSET = 500
ROWS_FILE = "rows.jsonl"          # the kept demonstrations tokenized in the serving format
ROWS_META = "rows.meta.json"      # which demonstrations (their hash) and tokenizer the rows came from


def build_demos(cfg: RunConfig, tasks: list[Task], out: Path, workers: int = 2) -> list[dict]:
    """Demonstrations for `tasks` (the training split only), `demos_per_task` each in the
    shapes of scaffolds.demos.VARIANTS; every attempt is recorded (kept or not) so a rerun skips it."""
    ws = cfg.warm_start
    done = {(r["task_id"], r["seed"]) for r in read_complete(out)}
    if all((t.id, k) in done for t in tasks for k in range(ws.demos_per_task)):
        return read_complete(out)      # nothing to build: no sandbox needed (a GPU host SFTs from here)
    from scaffolds.demos import build_demonstration, variant_flags
    # variant-major: every task's first demonstration before any second one, so a run stopped
    # early (or resumed later with a larger demos_per_task) covers the tasks evenly
    todo = [(t, k) for k in range(ws.demos_per_task) for t in tasks if (t.id, k) not in done]
    lock, slots = threading.Lock(), list(range(workers))
    started, finished = time.monotonic(), [0]
    print(f"[demos] {len(todo)} to build ({len(done)} done) for {len(tasks)} tasks", flush=True)

    def one(item):
        task, k = item
        with lock:
            slot = slots.pop()
        try:
            flags = variant_flags(k, ws.recovery_fraction)
            demo = build_demonstration(task, cfg.env, uid=cfg.env.sandbox_uid_base + DEMO_UID_OFFSET + slot, seed=k,
                                       recovery=flags.pop("recovery", False), **flags)
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
    from actors.chat_format import conversation_calls
    from rl.assembly import assemble

    rows = []
    for d in demos:
        if d.get("reward") != 1.0:
            continue
        for s in assemble(conversation_calls(tokenizer, d["messages"], d["tools"])).samples:
            rows.append({"input_ids": s.token_ids, "assistant_masks": s.loss_mask, "task_id": d["task_id"]})
    return rows


def demos_digest(demos: list[dict]) -> str:
    """sha256 of the kept demonstrations (task, seed, messages): the manifest's demo set hash."""
    h = hashlib.sha256()
    for d in sorted((d for d in demos if d.get("reward") == 1.0), key=lambda d: (d["task_id"], d["seed"])):
        h.update(json.dumps([d["task_id"], d["seed"], d["messages"]], sort_keys=True).encode())
    return h.hexdigest()


def cached_rows(folder: Path, tokenizer_dir: str, demos: list[dict]) -> list[dict]:
    """The rows of `demos`, tokenized once and kept beside them: a host without the serving
    stack (vLLM renders the chat format) trains from the file, and the hash says it is current."""
    meta = {"demos_sha256": demos_digest(demos), "tokenizer": Path(tokenizer_dir).name}
    rows_file, meta_file = folder / ROWS_FILE, folder / ROWS_META
    if rows_file.is_file() and meta_file.is_file() and json.loads(meta_file.read_text()) == meta:
        return read_complete(rows_file)
    from transformers import AutoTokenizer

    rows = sft_rows(AutoTokenizer.from_pretrained(tokenizer_dir), demos)
    rows_file.unlink(missing_ok=True)
    append_durable(rows_file, rows)
    meta_file.write_text(json.dumps(meta))
    return rows


def warm_start(cfg: RunConfig, folder: Path, train_tasks: list[Task], demos_only: bool = False,
               training_side: frozenset[str] = frozenset()) -> Path:
    """Demonstrations for `train_tasks` into `folder`, then SFT; returns the merged model folder
    (or the demonstrations file with `demos_only`). Reuses whatever a killed run finished.
    Harvested rows may come from `train_tasks` or `training_side` (the tasks calibration and
    GRPO use: a rejection-sampling round), never from the held-out side."""
    folder.mkdir(parents=True, exist_ok=True)
    demos = build_demos(cfg, train_tasks, folder / DEMOS_FILE) if cfg.warm_start.demos else []
    base = resolve_model_path(cfg.model.path)
    rows = cached_rows(folder, base, demos)   # tokenized here: a GPU host without vLLM trains from the file
    if demos_only:
        return folder / DEMOS_FILE
    if cfg.warm_start.max_rows is not None and cfg.warm_start.max_rows < len(rows):
        rows = random.Random(cfg.warm_start.seed).sample(rows, cfg.warm_start.max_rows)
    print(f"[warm-start] {len(rows)} demonstration rows from {len({r['task_id'] for r in rows})} of "
          f"{len(train_tasks)} demonstrated tasks", flush=True)
    train_ids = {t.id for t in train_tasks} | training_side
    for hdir in cfg.warm_start.harvest_dirs:
        from orchestrator.harvest import harvest_rows

        harvested = harvest_rows(hdir, cfg.warm_start.max_assistant_turns)
        foreign = sorted({r["task_id"] for r in harvested} - train_ids)
        if foreign:   # a harvest of another split would train on held-out tasks
            raise ValueError(f"harvest {hdir} holds tasks outside this run's training side: {foreign[:3]} "
                             "(a harvest of another split, or of its held-out tasks)")
        rows += harvested
        print(f"[warm-start] {len(harvested)} harvested rows from {hdir}", flush=True)
    return run_sft(rows, base, cfg.warm_start, folder / sft_folder_name(cfg), cfg.model, lora=cfg.lora)


def sft_folder_name(cfg: RunConfig) -> str:
    """`sft`, or `sft-<n>rows` for a sample of the rows (each rung of a ladder is its own SFT)."""
    return "sft" if cfg.warm_start.max_rows is None else f"sft-{cfg.warm_start.max_rows}rows"


def folder_for(cfg: RunConfig, run_dir: Path) -> Path:
    return Path(cfg.warm_start.dir) if cfg.warm_start.dir else Path(run_dir) / "warm_start"


def run_warm_start(cfg: RunConfig, run_dir: Path, demos_only: bool = False) -> Path:
    """The warm-start stage of `run_dir`: its split is written there first (as training will
    find it), and only its demo side is demonstrated (the whole training side unless
    task.demo_fraction sets tasks apart for calibration and GRPO)."""
    train_tasks = select_tasks(cfg.task, cfg.trainer.seed, run_dir, "demo")
    rl_side = frozenset(t.id for t in select_tasks(cfg.task, cfg.trainer.seed, run_dir, "train"))
    return warm_start(cfg, folder_for(cfg, run_dir), train_tasks, demos_only=demos_only, training_side=rl_side)


MANIFEST = "manifest.json"


def heldout_figures(eval_dir: Path) -> dict:
    """The figures of one held-out evaluation (`rlvr eval --out eval_dir`) that a manifest keeps."""
    summary = json.loads((Path(eval_dir) / "summary.json").read_text())
    k = summary["samples_per_task"]
    return {"eval_dir": str(eval_dir), "tasks": summary["tasks"], "k": k, "episodes": summary["episodes"],
            "pass_at_1": summary["pass_at_k"]["1"], f"pass_at_{k}": summary["pass_at_k"][str(k)],
            "edit_success_rate": summary.get("edit_success_rate"),
            "tool_failure_rate": summary.get("tool_failure_rate"),
            "by_level": {lvl: {"tasks": v["tasks"], "tasks_passed_at_n": v["tasks_passed_at_n"],
                               "pass_at_1": v["pass_at_k"]["1"], f"pass_at_{k}": v["pass_at_k"][str(k)]}
                         for lvl, v in summary.get("by_level", {}).items()}}


def ship(cfg: RunConfig, run_dir: Path, dest: Path, command: str, heldout: list[Path] = ()) -> Path:
    """Copy a finished warm-start's adapter to `dest` (a folder `model.path` can name) beside a
    manifest: the demonstration set's hash and counts, which tasks it demonstrated, the SFT
    settings and figures, the held-out evaluations of it (`heldout`), and the command that
    regenerates it."""
    folder = folder_for(cfg, run_dir)
    sft = folder / sft_folder_name(cfg)
    done = sft / "sft_done.json"
    if not done.is_file():
        raise FileNotFoundError(f"{sft}: no finished SFT to ship (run `rlvr warm-start` first)")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "base_model.txt"):
        shutil.copy2(sft / "adapter" / name, dest / name)
    demos = read_complete(folder / DEMOS_FILE)
    kept = [d for d in demos if d.get("reward") == 1.0]
    split = json.loads((Path(run_dir) / "split.json").read_text())
    manifest = {
        "command": command,
        "demos": {"sha256": demos_digest(demos), "attempted": len(demos), "kept": len(kept),
                  "tasks": len({d["task_id"] for d in kept}),
                  "variants": {v: sum(d["variant"] == v for d in kept) for v in sorted({d["variant"] for d in kept})}},
        "sft": json.loads(done.read_text()),
        "warm_start_config": cfg.warm_start.model_dump(),
        "lora_config": cfg.lora.model_dump(),
        "tasks_file": cfg.task.tasks_file, "split_seed": cfg.trainer.seed,
        "split": {side: split.get(side, []) for side in ("demo", "train", "test")},
        "heldout": [heldout_figures(d) for d in heldout],
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1))
    print(f"[warm-start] shipped {sft / 'adapter'} -> {dest} ({MANIFEST} beside it)", flush=True)
    return dest
