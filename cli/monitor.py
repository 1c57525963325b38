"""`rlvr monitor RUN_DIR`: live curves of a run (running or finished) in a browser, through
TensorBoard on the run's tracker folder (`logging.backends: [tensorboard]`)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.tracker import tensorboard_dir


def monitor_command(run_dir: str | Path, port: int, host: str) -> list[str]:
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(tensorboard_dir(run_dir)),
            "--port", str(port), "--host", host, "--reload_interval", "5"]


def monitor(args) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise SystemExit(f"rlvr monitor: {run_dir} is not a directory (a run's trainer.run_dir)")
    if not tensorboard_dir(run_dir).is_dir():
        print(f"[rlvr] {tensorboard_dir(run_dir)} does not exist yet: it appears at the first step of a run "
              f"with logging.backends=[tensorboard]; the viewer picks it up then", flush=True)
    print(f"[rlvr] live curves of {run_dir}: http://{args.host}:{args.port}/ (Ctrl-C stops the viewer)", flush=True)
    cmd = monitor_command(run_dir, args.port, args.host)
    os.execv(cmd[0], cmd)  # the viewer takes this process over: stopping it stops TensorBoard


def register(sub) -> None:
    p = sub.add_parser("monitor", help="live curves of a run in a browser (TensorBoard on RUN_DIR)")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--port", type=int, default=6006)
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to reach it from other machines")
    p.set_defaults(func=monitor)
