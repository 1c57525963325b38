"""Train/test firewall: the split is written once, at the training entry point, and
evaluation refuses any task the run trained on. A band file (written by `rlvr calibrate`
from the training side only) narrows the training side to tasks of a measured pass rate.

With `task.demo_fraction` > 0 the training side is cut once more: its "demo" share is what
the warm-start demonstrates, and calibration and GRPO see only the rest, so the band measures
skill on tasks the policy was never shown the answer to. Sides: "demo" (the warm-start's
tasks; the whole training side when demo_fraction is 0), "train" (calibration and GRPO: the
training side minus the demo tasks, or the demo tasks themselves with task.rl_tasks=demo, a
recall diagnostic), "test" (held out)."""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envs.tasks import Task, load_tasks, resolve_tasks_file
from rl.config import ConfigError, TaskConfig

SPLIT_FILE = "split.json"


class TrainedOnError(ValueError):
    """Evaluation was asked to score a task that the run trained on."""


@dataclass
class Split:
    train: list[str]
    test: list[str]
    train_fraction: float
    seed: int
    demo: list[str] = field(default_factory=list)  # a subset of train: only the warm-start sees them
    demo_fraction: float = 0.0


def _make(tasks: list[Task], train_fraction: float, seed: int, demo_fraction: float = 0.0) -> Split:
    """Shuffle the functions (all difficulty levels of one function move together, so no side
    holds another level of a function a different side stubs), then cut: training side first
    (its first share the demo side), held-out side last."""
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    ids = sorted(t.id for t in tasks)
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate task ids: a task could land on both sides of the split")
    groups: dict[str, list[str]] = {}
    for t in sorted(tasks, key=lambda t: t.id):
        groups.setdefault(t.function_key, []).append(t.id)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    n = len(ids)
    n_train = max(1, min(n - 1, round(n * train_fraction))) if n > 1 else n
    n_demo = max(1, round(n_train * demo_fraction)) if demo_fraction > 0 else 0
    train, demo, taken = [], [], 0
    for k in keys:   # whole functions until each side holds its share of tasks
        if taken >= n_train or (train and len(keys) > 1 and k == keys[-1]):
            break
        (demo if taken < n_demo else train).extend(groups[k])
        taken += len(groups[k])
    if demo_fraction > 0 and not train:   # at least one function is left for calibration and GRPO
        raise ValueError(f"demo_fraction {demo_fraction} leaves no training task outside the demonstrations")
    train += demo
    chosen = set(train)
    test = [i for i in ids if i not in chosen]
    return Split(train=sorted(train), test=sorted(test), train_fraction=train_fraction,
                 seed=seed, demo=sorted(demo), demo_fraction=demo_fraction)


def write_split(run_dir: str | Path, tasks: list[Task], train_fraction: float, seed: int,
                demo_fraction: float = 0.0) -> Split:
    """Write the run's split, or return the existing one if it is identical.

    Refuses to replace an existing, different split: a resumed run must not train on what
    an earlier split held out.
    """
    path = Path(run_dir) / SPLIT_FILE
    split = _make(tasks, train_fraction, seed, demo_fraction)
    if path.exists():
        existing = load_split(run_dir)
        if existing != split:
            raise ValueError(f"{path} already holds a different split (seed {existing.seed}, fraction "
                             f"{existing.train_fraction}, {len(existing.train)} train tasks, demo fraction "
                             f"{existing.demo_fraction}); a run's split is written once. Use a new run "
                             "directory, or the same tasks/seed/fractions.")
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(split), indent=1))
    tmp.replace(path)
    return split


def load_split(run_dir: str | Path) -> Split:
    path = Path(run_dir) / SPLIT_FILE
    if not path.exists():
        raise FileNotFoundError(f"no split at {path}: it is written when training starts")
    return Split(**json.loads(path.read_text()))


def assert_not_trained_on(run_dir: str | Path, task_ids: list[str]) -> None:
    """Raise TrainedOnError naming the overlap if any task id was in the run's training split."""
    train = set(load_split(run_dir).train)
    overlap = sorted(set(task_ids) & train)
    if overlap:
        raise TrainedOnError(f"refusing to evaluate {len(overlap)} task(s) the run in {run_dir} trained on, "
                             f"e.g. {overlap[0]}; evaluate only its held-out tasks (split.json 'test')")


def write_band(path: str | Path, band: dict) -> None:
    """band: {"tasks": [ids], "lo", "hi", "k", "per_task": {...}}; written atomically."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(band, indent=1))
    tmp.replace(path)


def load_band(path: str | Path) -> list[str]:
    """The task ids of a band file, with a clear error for a missing or malformed one."""
    try:
        band = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"task.band_file {path} does not exist (write it with `rlvr calibrate`)") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"task.band_file {path} is not JSON: {e}") from None
    if not isinstance(band, dict) or not isinstance(band.get("tasks"), list):
        raise ConfigError(f"task.band_file {path} has no 'tasks' list; write it with `rlvr calibrate`")
    return [str(t) for t in band["tasks"]]


def in_band(train_ids: list[str], band_file: str | Path) -> list[str]:
    """The training ids in the band, in split order; a band task off the training side is refused
    (it would train on a held-out task), and so is an empty band."""
    band = load_band(band_file)
    outside = sorted(set(band) - set(train_ids))
    if outside:
        raise ConfigError(f"task.band_file {band_file} holds {len(outside)} task(s) that are not on this run's "
                          f"training side (held out, or kept for the warm-start's demonstrations), e.g. "
                          f"{outside[0]}; calibrate with this run's split (rlvr calibrate --run-dir RUN)")
    chosen = [i for i in train_ids if i in set(band)]
    if not chosen:
        raise ConfigError(f"task.band_file {band_file} holds no task: no training task's pass rate fell in the "
                          "band; widen calibrate.lo / calibrate.hi or warm-start the policy first")
    return chosen


def _interleave(lists: list[list[Task]]) -> list[Task]:
    """Round robin: the first of each list, then the second of each, ..."""
    return [lst[i] for i in range(max(map(len, lists), default=0)) for lst in lists if i < len(lst)]


def spread(tasks: list[Task], n: int | None, seed: int) -> list[Task]:
    """n of the tasks spread over the library: a seeded round robin over source files, and within a
    file over functions, so a small calibration or evaluation does not sample the first module's
    first functions (the sides are sorted by id). None or n >= len(tasks): all, unchanged."""
    if not n or n >= len(tasks):
        return tasks
    rng = random.Random(seed)
    files: dict[str, dict[str, list[Task]]] = {}
    for t in sorted(tasks, key=lambda t: t.id):
        files.setdefault(t.module_path, {}).setdefault(t.function_key, []).append(t)
    per_file = []
    for funcs in files.values():
        groups = list(funcs.values())
        rng.shuffle(groups)
        for g in groups:
            rng.shuffle(g)
        per_file.append(_interleave(groups))
    rng.shuffle(per_file)
    return _interleave(per_file)[:n]


def select_tasks(task_cfg: TaskConfig, seed: int, split_dir: str | Path, side: str,
                 trained_split: bool = False) -> list[Task]:
    """The one task selector: one side ("demo" | "train" | "test") of a run's split, in split order.

    split_dir holds split.json. trained_split=False writes the split there from the config
    (once; identical on a resume). trained_split=True reads the split a training run wrote,
    and the test side refuses any task that run trained on.
    """
    try:
        tasks_file = resolve_tasks_file(task_cfg.tasks_file, task_cfg.library)
        tasks = load_tasks(tasks_file)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    if task_cfg.levels and not any(t.level in task_cfg.levels for t in tasks):
        raise ConfigError(f"{tasks_file} holds no task of level(s) {task_cfg.levels}; "
                          "`rlvr tasks info` lists its levels")
    reuse = trained_split or bool(task_cfg.levels and (Path(split_dir) / SPLIT_FILE).exists())
    if task_cfg.levels and not reuse:           # a new split is made of those levels only
        tasks = [t for t in tasks if t.level in task_cfg.levels]
    if task_cfg.max_tasks:
        tasks = tasks[:task_cfg.max_tasks]
    if reuse:
        split = load_split(split_dir)
        if side == "test" and trained_split:
            assert_not_trained_on(split_dir, split.test)
    else:
        split = write_split(split_dir, tasks, task_cfg.train_fraction, seed, task_cfg.demo_fraction)
    if side not in ("demo", "train", "test"):
        raise ValueError(f"side must be demo, train or test, not {side!r}")
    demonstrated = split.demo or split.train
    if side == "demo" or (side == "train" and task_cfg.rl_tasks == "demo"):
        ids = demonstrated
    elif side == "train":
        shown = set(split.demo)
        ids = [i for i in split.train if i not in shown]
    else:
        ids = split.test
    if side == "train" and task_cfg.band_file:
        ids = in_band(ids, task_cfg.band_file)
    by_id = {t.id: t for t in tasks}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ConfigError(f"split task {missing[0]!r} is not in {tasks_file}; use the task file "
                          "(and task.max_tasks) the run was split from")
    if side == "train" and not ids:
        raise ConfigError(f"no training tasks in {tasks_file} after the split; raise task.max_tasks "
                          "or task.train_fraction")
    chosen = [by_id[i] for i in ids]
    if task_cfg.levels and reuse:                # a run's split, narrowed to some levels
        chosen = [t for t in chosen if t.level in task_cfg.levels]
    return chosen
