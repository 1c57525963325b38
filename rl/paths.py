"""Where the project keeps things on a host: one definition of each home and root.

- cache: `$XDG_CACHE_HOME/agentic-rlvr` (default model, sdists, pristine trees);
- RLVR_HOME: the world-readable sandbox Python and the pi agent (scripts/setup.sh), and the
  libraries' test-dependency overlays (envs/testdeps.py);
- the work root: sandbox checkouts (never under /root: sandbox uids cannot enter it).
Read at call time, so a test or a job can point them elsewhere through the environment.
"""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_WORK_ROOT = "/tmp/agentic-rlvr-work"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentic-rlvr"


def rlvr_home() -> Path:
    return Path(os.environ.get("RLVR_HOME", "/opt/agentic-rlvr"))
