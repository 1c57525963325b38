"""Durable JSON-lines files: the one append and the one read policy for every log the
project keeps (episode buffers, rollout traces, metrics, evaluation records).

- append: one line per object, flushed and fsync'd before returning, so a kill right after
  loses nothing;
- a last line without its newline was being written when the process died: readers drop
  it and the next append cuts it off first;
- any other line that is not JSON is damage: reading refuses, naming the file and line.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable

_append_lock = threading.Lock()  # threads of one process append whole lines, never interleaved


class DamagedLog(ValueError):
    """A complete line in the middle of a JSONL log is not JSON."""


def append_durable(path: str | Path, objs: Iterable[Any], **dumps_kw: Any) -> None:
    """Append each object as one JSON line, then fsync."""
    data = "".join(json.dumps(o, **dumps_kw) + "\n" for o in objs)
    with _append_lock:
        repair_tail(path)
        with open(path, "a") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def read_complete(path: str | Path) -> list[Any]:
    """Every complete line's object, in order; [] if the file does not exist."""
    path = Path(path)
    if not path.exists():
        return []
    *complete, partial = path.read_text().split("\n")
    out = []
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DamagedLog(f"{path}:{n} is not a JSON record ({e}); the log is damaged: "
                             "fix or remove that line, then resume") from None
    if partial.strip():
        print(f"[rlvr] {path}: ignoring an unfinished last line ({len(partial)} chars)", flush=True)
    return out


def repair_tail(path: str | Path) -> None:
    """Cut an unfinished last line so the next append starts on a fresh line."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


def rewrite(path: str | Path, objs: Iterable[Any]) -> None:
    """Replace the whole file atomically (write a sibling, then rename)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(o) + "\n" for o in objs)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
