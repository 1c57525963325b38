"""Evaluator: held-out tasks x k samples through a scaffold (pi by default) against a served
policy, one durable raw record per finished episode, resumable.

Plain class, made a Ray actor by orchestrator.cluster.spawn_evaluator. The out dir holds
`plan.json` (what is being evaluated; a resume must match it) and `episodes.jsonl` (the raw
records). A killed evaluation, run again with the same plan, re-runs only the (task, sample)
pairs without a record; every report is recomputed from the records (orchestrator/eval_report.py).
"""
from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from envs.tasks import Task
from orchestrator.env_slots import EnvSlots
from orchestrator.eval_report import RECORDS_FILE, append_record, load_records, record_key, write_report
from rl.config import RunConfig
from scaffolds.episode import EpisodeSettings, run_episode, safe_id


class PlanMismatch(ValueError):
    """The out dir already holds an evaluation of something else."""


class Evaluator:
    def __init__(self, cfg: RunConfig, out_dir: str) -> None:
        self.cfg = cfg
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.records_path = self.out / RECORDS_FILE
        self.attempt = uuid.uuid4().hex[:8]  # tells the runs of a resumed evaluation apart

    def _check_plan(self, plan: dict) -> None:
        path = self.out / "plan.json"
        if path.exists():
            old = json.loads(path.read_text())
            if old != plan:
                diff = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
                raise PlanMismatch(f"{self.out} holds an evaluation with a different {', '.join(diff)}; "
                                   "use another eval.out_dir, or the same tasks/k/scaffold/model to resume")
            return
        path.write_text(json.dumps(plan, indent=1))

    def pending(self, tasks: list[Task], k: int) -> list[tuple[Task, int]]:
        done = {record_key(r) for r in load_records(self.records_path)}
        return [(t, s) for t in tasks for s in range(k) if (t.id, s) not in done]

    def run(self, tasks: list[Task | dict], base_url: str, model_id: str, env_actors: list,
            worker=None, max_episodes: int | None = None) -> dict:
        """Run what is missing, then return the report recomputed from all records.

        worker: the RolloutWorker handle behind base_url; its per-episode call records are
        drained (and counted) so the server does not keep them. max_episodes stops early
        (used to test resuming).
        """
        tasks = [t if isinstance(t, Task) else Task.from_json(t) for t in tasks]
        e = self.cfg.eval
        self._check_plan({"tasks": [t.id for t in tasks], "k": e.k, "scaffold": e.scaffold,
                          "model": model_id, "model_path": self.cfg.model.path})
        todo = self.pending(tasks, e.k)
        if max_episodes is not None:
            todo = todo[:max_episodes]
        print(f"[rlvr eval] {len(tasks)} tasks x k={e.k}: {len(todo)} episodes to run "
              f"(attempt {self.attempt})", flush=True)
        slots = len(env_actors) * self.cfg.env.pool_size
        parallel = max(1, min(e.parallel or slots, slots))
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            settings = replace(EpisodeSettings.for_eval(self.cfg), model_id=model_id)
            env_slots = EnvSlots(env_actors, self.cfg.env.pool_size)
            futures = [pool.submit(self._episode, task, sample, base_url, settings, env_slots, worker)
                       for task, sample in todo]
            for f in futures:
                f.result()  # an infrastructure failure surfaces; finished records are already on disk
        return self.report(model_id)

    def report(self, model_id: str) -> dict:
        e = self.cfg.eval
        return write_report(self.out, title=f"{e.scaffold} eval of {model_id} (k={e.k})")

    def keep(self, run, record: dict) -> None:
        """What a subclass keeps of a finished episode besides its record (the harvest: rows)."""

    def _episode(self, task: Task, sample: int, base_url: str, settings: EpisodeSettings, env_slots: EnvSlots,
                 worker) -> dict:
        episode_id = f"eval-{self.attempt}-{uuid.uuid4().hex[:8]}"
        events = self.out / "events" / f"{safe_id(task.id)}-s{sample}.jsonl"
        with env_slots.take() as env_actor:
            run = run_episode(env_actor, worker, task, episode_id, base_url, settings, events_path=events)
        record = {**asdict(run.record), "sample": sample, "attempt": self.attempt, "scaffold": settings.scaffold,
                  "model": settings.model_id, "finished_at": time.time()}
        self.keep(run, record)
        append_record(self.records_path, record)   # last: a record on disk means its episode is complete
        r = run.record
        print(f"[rlvr eval] {task.id} s{sample}: reward {r.reward:.2f} "
              f"({r.stop_reason}, {r.turns} turns, {r.seconds:.0f}s)", flush=True)
        return record
