"""Task records: everything needed to rebuild a stubbed checkout and verify it, one JSON line each."""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from rl.types import LEVELS, Level


@dataclass
class Task:
    id: str                      # "<library>-<version>:<module path>:<qualname>"
    library: str
    version: str
    sdist_filename: str
    sdist_sha256: str
    sdist_url: str
    module_path: str             # relative to the sdist's top directory, e.g. "toolz/itertoolz.py"
    qualname: str
    body_start_line: int         # 1-based, inclusive: the lines the stub replaces
    body_end_line: int
    original_body: str           # exact text of those lines (the reference solution)
    stub_body: str               # what replaces them
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    test_command: list[str]      # argv run in the checkout, e.g. ["python", "-m", "pytest", ...]
    problem_statement: str
    meta: dict = field(default_factory=dict)
    level: Level = "body"        # what the stub removed (task files without it are whole-body stubs)
    test_deps: list[str] = field(default_factory=list)   # pinned distributions of the test overlay
    # the differential gate's inputs (envs/gate.py): "calls" the tests make, "perturbed" ones,
    # "seen", and a "note" saying why there are none or few; {} in files written before the gate
    gate: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"task {self.id}: unknown level {self.level!r} (one of {', '.join(LEVELS)})")

    @property
    def function_key(self) -> str:
        """The function the task stubs: every level of one function shares it, and the split keeps
        them on one side (a whole-body task's id is exactly this key)."""
        return f"{self.library}-{self.version}:{self.module_path}:{self.qualname}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)

    @classmethod
    def from_json(cls, text: str | dict) -> "Task":
        data = json.loads(text) if isinstance(text, str) else dict(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        missing = {f.name for f in fields(cls) if f.name not in data
                   and f.default is MISSING and f.default_factory is MISSING}
        if unknown or missing:
            raise ValueError(f"not a task record: missing {sorted(missing)}, unknown {sorted(unknown)}")
        return cls(**data)

    def stubbed_source(self, original_file: str) -> str:
        """Apply the stub to the module's pristine text, checking it is the file mined from."""
        lines = original_file.splitlines(keepends=True)
        body = "".join(lines[self.body_start_line - 1:self.body_end_line])
        if body != self.original_body:
            raise ValueError(f"task {self.id}: {self.module_path} lines {self.body_start_line}-"
                             f"{self.body_end_line} do not match the recorded body; wrong sdist?")
        return "".join(lines[:self.body_start_line - 1]) + self.stub_body + "".join(lines[self.body_end_line:])

    def solved_source(self, stubbed_file: str) -> str:
        """Inverse of stubbed_source (the reference solution), used to check tasks end to end."""
        lines = stubbed_file.splitlines(keepends=True)
        n = self.stub_body.count("\n") or 1
        if "".join(lines[self.body_start_line - 1:self.body_start_line - 1 + n]) != self.stub_body:
            raise ValueError(f"task {self.id}: the stub is not at line {self.body_start_line} of {self.module_path}")
        return "".join(lines[:self.body_start_line - 1]) + self.original_body + "".join(lines[self.body_start_line - 1 + n:])


def load_tasks(path: str | Path) -> list[Task]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file not found: {path} (write one with `rlvr tasks mine <library> --out {path}`)")
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(Task.from_json(line))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: {e}") from None
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate task ids")
    return tasks


def save_tasks(tasks: list[Task], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(t.to_json() + "\n" for t in tasks))
    tmp.replace(path)


SHIPPED_TASKS = Path(__file__).resolve().parent.parent / "configs" / "tasks"


def resolve_tasks_file(tasks_file: str | None, library: str) -> Path:
    """The config's task file, or the one shipped for `library` under configs/tasks/."""
    if tasks_file:
        return Path(tasks_file)
    shipped = SHIPPED_TASKS / f"{library}.jsonl"
    if not shipped.is_file():
        raise FileNotFoundError(f"no task file for library {library!r}: run `rlvr tasks mine {library}` "
                                f"and set task.tasks_file")
    return shipped
