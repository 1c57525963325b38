"""An actor's whole output (vLLM and Python logging, warnings, C++ messages, progress bars)
copied into a file in the run directory.

`with_output_copied(cls)` is the actor class whose constructor first calls `tee_output`, in
the actor's own process; `RLVR_ACTOR_LOG` (set in the actor's runtime env) names the file,
and without it nothing changes. The output still reaches
Ray's own worker log as well, so the dashboard's per-actor log view keeps working; the
driver only echoes it to the console at `logging.console: debug`.
"""
from __future__ import annotations

import os
import threading

LOG_ENV = "RLVR_ACTOR_LOG"


def with_output_copied(cls: type) -> type:
    """A subclass of an actor class that copies its process's output before building it."""
    class Logged(cls):
        def __init__(self, *args, **kwargs):
            tee_output()
            super().__init__(*args, **kwargs)

    # the class name Ray shows (dashboard, process titles); cloudpickle still ships it by value,
    # since actors.logfiles has no attribute of that name
    Logged.__name__ = Logged.__qualname__ = cls.__name__
    Logged.__doc__ = cls.__doc__
    return Logged


def tee_output() -> None:
    """Route file descriptors 1 and 2 through pipes whose readers write both to the log file
    and to the original descriptor. Nothing happens without RLVR_ACTOR_LOG."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        original = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        threading.Thread(target=_pump, args=(read_end, (log_fd, original)), daemon=True,
                         name=f"rlvr-tee-{fd}").start()


def _pump(read_end: int, targets: tuple[int, ...]) -> None:
    while chunk := os.read(read_end, 65536):
        for fd in targets:
            _write_all(fd, chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
