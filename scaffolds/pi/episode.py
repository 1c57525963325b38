"""One pi episode: configure, launch, read its events under a wall clock and a turn cap,
and judge the outcome; and pi as a `Scaffold` on the EnvActor that holds the checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from envs.tools import bad_timeout_message
from rl.config import ScaffoldConfig
from scaffolds.base import EpisodeOutcome, ScaffoldInputs
from scaffolds.pi.events import MAX_TURNS, WALL_CLOCK, PiEventStream
from scaffolds.pi.install import pi_argv, pi_cli_path, write_pi_config
from scaffolds.pi.launch import MARKER_ENV, Launcher, SandboxLauncher
from scaffolds.system_prompt import CODING_SYSTEM_PROMPT


def run_pi_episode(launcher: Launcher, task_prompt: str, base_url: str, model_id: str,
                   cfg: ScaffoldConfig, *, context_window: int, max_tokens: int,
                   events_path: str | Path | None = None, system_prompt: str | None = None,
                   checkout: str | Path | None = None, retries: int = 1,
                   poll_s: float = 0.05) -> EpisodeOutcome:
    """Run pi for one episode and judge it from its events.

    base_url is the episode's OpenAI base (e.g. `<server>/episodes/<id>/v1`), as seen from the
    host; the launcher makes it reachable where pi runs. Never raises for anything the agent
    or the server does: those end as an outcome with a stop reason and an error.
    """
    if checkout is not None and (Path(checkout) / ".pi").exists() and system_prompt is None:
        raise ValueError(f"{checkout}/.pi would override pi's config and system prompt (it applies "
                         "even with -nc); pass system_prompt explicitly or remove the .pi directory")
    if not pi_cli_path().exists():
        raise FileNotFoundError(f"pi is not installed at {pi_cli_path()}; run scripts/setup.sh "
                                f"(or set RLVR_HOME to where pi lives)")
    work = Path(tempfile.mkdtemp(prefix="pi-episode-"))
    os.chmod(work, 0o755)
    events_file = Path(events_path) if events_path else work / "events.jsonl"
    events_file.parent.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    env = {"PI_OFFLINE": "1", "NO_COLOR": "1", "PYTHONDONTWRITEBYTECODE": "1", MARKER_ENV: marker,
           "RLVR_BAD_TIMEOUT_MESSAGE": bad_timeout_message("{value}", "to run the command without a time limit")}
    start = time.monotonic()
    try:
        with open(events_file, "w") as log, open(work / "stderr.txt", "wb") as err:
            stream = PiEventStream(log=log, max_turns=cfg.max_turns)
            config_dir, inside_config_dir, inside_url = launcher.prepare(work, base_url)
            write_pi_config(config_dir, inside_url, model_id, context_window, max_tokens, retries)
            env["PI_CODING_AGENT_DIR"] = inside_config_dir
            proc = launcher.start(pi_argv(model_id, task_prompt, system_prompt, launcher.guard), env, err)
            ended_by = _drive(launcher, proc, stream, cfg, poll_s)
        stderr_tail = (work / "stderr.txt").read_text(errors="replace")[-2000:]
        return _judge(stream, ended_by, proc.returncode, time.monotonic() - start, stderr_tail,
                      str(events_file) if events_path else None, cfg)
    finally:
        launcher.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def _drive(launcher: Launcher, proc: subprocess.Popen, stream: PiEventStream, cfg: ScaffoldConfig,
           poll_s: float) -> str | None:
    """Pump pi's stdout on a thread; stop it on wall clock, turn cap or a fatal event."""
    reader = threading.Thread(target=_pump, args=(proc, stream), daemon=True)
    reader.start()
    deadline = time.monotonic() + cfg.wall_clock_s
    ended_by = None
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            ended_by = WALL_CLOCK
        elif stream.halted.is_set():
            ended_by = stream.halt_reason
        if ended_by:
            launcher.stop(proc)
            break
        stream.halted.wait(poll_s)
    else:
        launcher.stop(proc)  # pi exited; end anything it left behind
    reader.join(timeout=10)
    return ended_by


def _pump(proc: subprocess.Popen, stream: PiEventStream) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        stream.feed(raw.decode("utf-8", errors="replace"))
    proc.stdout.close()


def _judge(stream: PiEventStream, ended_by: str | None, exit_code: int | None, seconds: float,
           stderr_tail: str, events_path: str | None, cfg: ScaffoldConfig) -> EpisodeOutcome:
    if ended_by == WALL_CLOCK:
        stop, error = WALL_CLOCK, f"wall clock {cfg.wall_clock_s:.0f}s reached after {stream.turns} turns"
    elif ended_by == MAX_TURNS:
        stop, error = MAX_TURNS, f"turn cap scaffold.max_turns={cfg.max_turns} reached"
    elif stream.stop_reason is None:
        stop = "error"
        error = f"pi exited {exit_code} without an assistant message; stderr: {stderr_tail.strip()[-500:]}"
    else:
        stop = stream.stop_reason
        error = stream.error_message if stop in ("error", "aborted") else None
        if stop == "length":
            error = "model output cut off by max_tokens (finish_reason=length)"
        if exit_code not in (0, None) and error is None:
            error = f"pi exited {exit_code}; stderr: {stderr_tail.strip()[-500:]}"
    return EpisodeOutcome(stop_reason=stop, turns=stream.turns, tool_calls=stream.tool_calls,
                          tool_failures=stream.tool_failures, edits=stream.edits,
                          edit_failures=stream.edit_failures, seconds=round(seconds, 3), error=error,
                          events_path=events_path, retries=stream.retries, exit_code=exit_code,
                          final_text=stream.final_text[-2000:])


def run_pi_in_env(env, task_prompt: str, base_url: str, model_id: str, cfg: ScaffoldConfig,
                  context_window: int, max_tokens: int, events_path: str | None = None,
                  system_prompt: str | None = CODING_SYSTEM_PROMPT) -> EpisodeOutcome:
    """One pi episode inside a CodingEnv's sandbox (runs where the env lives, on its EnvActor)."""
    launcher = SandboxLauncher(env.sandbox, cpu_s=int(cfg.wall_clock_s) + 5)
    return run_pi_episode(launcher, task_prompt, base_url, model_id, cfg, context_window=context_window,
                          max_tokens=max_tokens, events_path=events_path, system_prompt=system_prompt,
                          checkout=env.checkout)


def run_pi_episode_on_actor(env_actor, env_episode: str, task_prompt: str, base_url: str, model_id: str,
                            cfg: ScaffoldConfig, context_window: int, max_tokens: int,
                            events_path: str | None = None,
                            system_prompt: str | None = CODING_SYSTEM_PROMPT) -> EpisodeOutcome:
    """Run one pi episode on the EnvActor that holds the episode's checkout (Ray handle).

    context_window/max_tokens go into pi's model entry (the run's rollout.max_model_len and
    rollout.max_tokens)."""
    import ray

    return ray.get(env_actor.run_in_episode.remote(
        env_episode, run_pi_in_env, task_prompt, base_url, model_id, cfg, context_window, max_tokens,
        events_path, system_prompt))


class PiScaffold:
    """pi inside the episode's sandbox, as a `Scaffold`."""
    name = "pi"

    def run(self, inputs: ScaffoldInputs) -> EpisodeOutcome:
        return run_pi_episode_on_actor(inputs.env_actor, inputs.env_episode, inputs.task_prompt, inputs.episode_url,
                                       inputs.model_id, inputs.cfg, context_window=inputs.context_window,
                                       max_tokens=inputs.max_tokens, events_path=inputs.events_path)
