"""Harvest: k episodes per *training* task through the configured scaffold, scored by the
real reward; the short, clean successes become warm-start rows.

It is the evaluator (same plan file, same durable records, same resume) pointed at the
training split, keeping one more thing per episode: the token rows of a kept success, in
`rows.jsonl`, written before the episode's record. Against the project's policy server the
rows are the recorded token ids; against another endpoint (behind actors/recording_proxy.py)
they are its messages rendered in the trained model's serving format.

Kept = reward 1.0, at most `warm_start.max_assistant_turns` assistant turns, not stopped by
the wall clock (the research report's filters: short successes, no time-outs).
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.eval_report import PASS_REWARD, RECORDS_FILE, load_records
from orchestrator.evaluator import Evaluator
from rl.jsonl import append_durable, read_complete

ROWS_FILE = "rows.jsonl"
WALL_CLOCK = "wall_clock"


def kept(record: dict, max_turns: int) -> bool:
    return (float(record["reward"]) >= PASS_REWARD and (record.get("turns") or 0) <= max_turns
            and record.get("stop_reason") != WALL_CLOCK)


class Harvester(Evaluator):
    def keep(self, run, record: dict) -> None:
        if not run.sequences or not kept(record, self.cfg.warm_start.max_assistant_turns):
            return
        append_durable(self.out / ROWS_FILE, [
            {"task_id": record["task"], "sample": record["sample"], "episode": record["episode"],
             "input_ids": s.token_ids, "assistant_masks": s.loss_mask} for s in run.sequences])

    def report(self, model_id: str) -> dict:
        summary = super().report(model_id)
        rows = harvest_rows(self.out, self.cfg.warm_start.max_assistant_turns)
        summary["harvest"] = {"rows": len(rows), "tasks": len({r["task_id"] for r in rows})}
        print(f"[rlvr harvest] {len(rows)} rows from {summary['harvest']['tasks']} tasks in {self.out / ROWS_FILE}",
              flush=True)
        return summary


def harvest_rows(harvest_dir: str | Path, max_turns: int) -> list[dict]:
    """The rows of a harvest folder whose episode has a finished record that passes the
    filters (a row written just before a kill, without its record, is dropped: that episode
    ran again on resume)."""
    folder = Path(harvest_dir)
    episodes = {r["episode"] for r in load_records(folder / RECORDS_FILE) if kept(r, max_turns)}
    return [r for r in read_complete(folder / ROWS_FILE) if r["episode"] in episodes]
