"""Where the project keeps things on a host: one definition of each home and root.

- cache: `$XDG_CACHE_HOME/agentic-rlvr` (default model, sdists, pristine trees);
- RLVR_HOME: the world-readable sandbox Python and the pi agent (scripts/setup.sh), the
  libraries' test-dependency overlays (envs/testdeps.py), and vLLM's compile cache (CUDA-graph
  engines compile once per model shape; a later start reads the result);
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


def vllm_cache_dir() -> Path:
    """VLLM_CACHE_ROOT for GPU engines: torch.compile's artifacts for CUDA graphs, kept across runs."""
    return rlvr_home() / "vllm-cache"
