"""Where pi is installed, and the private config and command line of one pi run."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rl.paths import rlvr_home

PI_PACKAGE = "@mariozechner/pi-coding-agent"
PI_GUARD = Path(__file__).with_name("pi_guard.js")   # pi's one extension: refuses a bash timeout <= 0
PROVIDER = "local"


def pi_cli_path() -> Path:
    """pi's JS entry point (run with node directly: the .bin symlink's shebang uses `env`)."""
    return rlvr_home() / "pi" / "node_modules" / PI_PACKAGE / "dist" / "cli.js"


def node_path() -> str:
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is not on PATH; run scripts/setup.sh (pi needs Node >= 20.6)")
    return os.path.realpath(node)


def write_pi_config(config_dir: Path, base_url: str, model_id: str, context_window: int,
                    max_tokens: int, retries: int = 1) -> None:
    """A private agent dir: one local provider, no compaction, few retries.

    Compaction is off because its threshold (contextWindow - 16384 reserved) is always crossed
    by a small served context, and its summary call would be an extra policy call per episode.
    """
    config_dir.mkdir(parents=True, exist_ok=True)
    models = {"providers": {PROVIDER: {
        "baseUrl": base_url, "api": "openai-completions", "apiKey": "rlvr-local",
        "models": [{"id": model_id, "name": model_id, "contextWindow": context_window,
                    "maxTokens": max_tokens, "reasoning": False, "input": ["text"],
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}]}}}
    settings = {"compaction": {"enabled": False},
                "retry": {"enabled": retries > 0, "maxRetries": max(retries, 1), "baseDelayMs": 500,
                          "provider": {"maxRetries": 0}}}
    (config_dir / "models.json").write_text(json.dumps(models, indent=1))
    (config_dir / "settings.json").write_text(json.dumps(settings, indent=1))


def pi_argv(model_id: str, task_prompt: str, system_prompt: str | None, guard: str) -> list[str]:
    """guard: where pi finds scaffolds/pi/pi_guard.js (the only extension it loads)."""
    argv = [node_path(), str(pi_cli_path()), "--mode", "json", "--no-session", "-nc",
            "--no-extensions", "--extension", guard, "--no-skills", "--no-prompt-templates", "--no-themes",
            "--model", f"{PROVIDER}/{model_id}"]
    if system_prompt is not None:
        argv += ["--system-prompt", system_prompt]
    return argv + [task_prompt]
