"""An actor's whole output (vLLM and Python logging, warnings, C++ messages, progress bars)
copied into a file in the driver's run directory, wherever the actor runs.

`with_output_copied(cls)` is the actor class whose constructor first calls `tee_output`, in
the actor's own process; `RLVR_ACTOR_LOG` (set in the actor's runtime env) names the file,
and without it nothing changes. An actor on the driver's node (`RLVR_LOG_NODE`) appends to
that file itself; one on another node, which need not see the run directory at all, sends
its output to the `LogSink` actor (`RLVR_LOG_SINK`) pinned to the driver's node, which
appends it there: the closing table and a failed run's log tail find every actor's log in
one place, also what an actor printed before its node died. The output still reaches Ray's
own worker log as well, so the dashboard's per-actor log view keeps working; the driver only
echoes it to the console at `logging.console: debug`.
"""
from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

LOG_ENV = "RLVR_ACTOR_LOG"
LOG_NODE_ENV = "RLVR_LOG_NODE"   # the Ray node id of the driver (whose file system holds the run dir)
LOG_SINK_ENV = "RLVR_LOG_SINK"   # the LogSink actor's name, for actors on other nodes


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


class LogSink:
    """Appends the output that actors on other nodes send to their files in `log_dir`, on
    the driver's node."""

    def __init__(self, log_dir: str):
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, data: bytes) -> None:
        with open(self.dir / Path(name).name, "ab") as f:   # a name, never a path elsewhere
            f.write(data)


def tee_output() -> None:
    """Route file descriptors 1 and 2 through pipes whose readers write both to the log (the
    file, or the driver's LogSink) and to the original descriptor. Nothing happens without
    RLVR_ACTOR_LOG."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    to_log = _log_writer(path)
    originals = []
    for fd in (1, 2):
        original = os.dup(fd)
        originals.append(original)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        threading.Thread(target=_pump, args=(read_end, (to_log, _fd_writer(original))), daemon=True,
                         name=f"rlvr-tee-{fd}").start()


def _log_writer(path: str) -> Callable[[bytes], None]:
    """Where this actor's log goes: the file itself on the driver's node, else the LogSink.
    The log starts with a line naming the actor's node and process."""
    import ray

    here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    driver_node, sink_name = os.environ.get(LOG_NODE_ENV), os.environ.get(LOG_SINK_ENV)
    header = f"[rlvr] {Path(path).stem} on node {_node_ip()} (pid {os.getpid()})\n".encode()
    if here is None or driver_node in (None, here) or not sink_name:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        write = _fd_writer(log_fd)
    else:
        write = _SinkWriter(ray.get_actor(sink_name), Path(path).name)
    write(header)
    return write


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "?"


def _fd_writer(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    return write


class _SinkWriter:
    """Sends output to the LogSink from a thread of its own, in order, one batch per call,
    each acknowledged before the next (so a sink that is gone is noticed, not flooded)."""

    def __init__(self, sink, name: str):
        self.sink, self.name = sink, name
        self.chunks: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.gone = False
        threading.Thread(target=self._send, daemon=True, name="rlvr-log-sink").start()

    def __call__(self, data: bytes) -> None:
        if not self.gone:
            self.chunks.put(data)

    def _send(self) -> None:
        import ray

        while True:
            batch = [self.chunks.get()]
            while not self.chunks.empty():
                batch.append(self.chunks.get())
            try:
                ray.get(self.sink.write.remote(self.name, b"".join(batch)))
            except ray.exceptions.RayActorError as e:   # the driver (and its sink) ended: Ray's log keeps the rest
                self.gone = True
                os.write(2, f"[rlvr] log sink gone ({type(e).__name__}); this actor's output now only "
                            "reaches Ray's worker log\n".encode())
                return


def _pump(read_end: int, targets: tuple[Callable[[bytes], None], ...]) -> None:
    while chunk := os.read(read_end, 65536):
        for write in targets:
            write(chunk)
