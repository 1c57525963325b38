"""One headless episode of the pi coding agent (the deployment scaffold).

pi exits 0 even when the episode failed, has no turn cap and hangs forever on a stalled
stream, so the outcome is judged from its JSON event stream (the last assistant message's
`stopReason`), a wall clock and a turn cap are enforced here, and on either the whole process
tree is ended. Its `message_update` events repeat the whole partial message each time (quadratic
in length), so stdout is parsed line by line and those lines are never stored.

`run_pi_episode` is the single entry point for training, evaluation and best-of-N (via
`run_pi_in_env` / `run_pi_episode_on_actor` where the checkout lives on an EnvActor). The
system prompt defaults to the one the native scaffold renders (scaffolds/system_prompt.py),
passed with --system-prompt so a repository's `.pi/SYSTEM.md` cannot replace it. Where pi
runs is a `Launcher`: `HostLauncher` (a plain process group, for development) or
`SandboxLauncher` (inside the episode's sandbox, reaching the policy server through a
forwarded unix socket; see scaffolds/socket_forward.py).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import urlsplit, urlunsplit

from envs.sandbox import chown_tree, sandbox_python_dir
from envs.tools import bad_timeout_message
from rl.config import ScaffoldConfig
from rl.paths import rlvr_home
from scaffolds import socket_forward
from scaffolds.base import EpisodeOutcome, ScaffoldInputs
from scaffolds.socket_forward import UnixToTcp
from scaffolds.system_prompt import CODING_SYSTEM_PROMPT

PI_PACKAGE = "@mariozechner/pi-coding-agent"
PI_GUARD = Path(__file__).with_name("pi_guard.js")   # pi's one extension: refuses a bash timeout <= 0
PROVIDER = "local"
MARKER_ENV = "RLVR_EPISODE_MARKER"  # tags every process of one episode, so none can be missed at cleanup
STOP_REASONS = ("stop", "length", "toolUse", "error", "aborted")  # pi's own
# ours, when pi did not end the episode itself (names shared with the native scaffold):
WALL_CLOCK, MAX_TURNS = "wall_clock", "max_turns"


def pi_cli_path() -> Path:
    """pi's JS entry point (run with node directly: the .bin symlink's shebang uses `env`)."""
    return rlvr_home() / "pi" / "node_modules" / PI_PACKAGE / "dist" / "cli.js"


def node_path() -> str:
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is not on PATH; run scripts/setup.sh (pi needs Node >= 20.6)")
    return os.path.realpath(node)


@dataclass
class PiEventStream:
    """Incremental reader of pi's `--mode json` stdout; keeps counters, not events."""
    log: IO[str] | None = None
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    edits: int = 0
    edit_failures: int = 0
    retries: int = 0
    stop_reason: str | None = None
    error_message: str | None = None
    final_text: str = ""
    bad_lines: int = 0
    tool_names: list[str] = field(default_factory=list)
    max_turns: int | None = None
    halt_reason: str | None = None
    halted: threading.Event = field(default_factory=threading.Event)

    def feed(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            self.bad_lines += 1
            self._write({"type": "unparsed_stdout", "text": line[:2000]})
            return
        kind = event.get("type")
        if kind == "message_update":
            return
        self._write(event)
        if self.halted.is_set():  # the outcome is fixed; later events are logged, not counted
            return
        if kind == "message_end":
            msg = event.get("message") or {}
            if msg.get("role") == "assistant":
                self.turns += 1
                self.stop_reason = msg.get("stopReason")
                self.error_message = msg.get("errorMessage")
                texts = [c.get("text", "") for c in msg.get("content") or [] if c.get("type") == "text"]
                self.final_text = "".join(texts)
                if self.stop_reason == "length":
                    # pi would still run a truncated tool call and carry on; the episode ends here
                    self._halt("length")
                elif self.stop_reason == "toolUse" and self.max_turns and self.turns >= self.max_turns:
                    self._halt(MAX_TURNS)  # stop before pi asks the policy for another turn
        elif kind == "tool_execution_end":
            self.tool_calls += 1
            self.tool_names.append(str(event.get("toolName")))
            if event.get("isError"):
                self.tool_failures += 1
            if event.get("toolName") == "edit":
                self.edits += 1
                self.edit_failures += int(bool(event.get("isError")))
        elif kind == "auto_retry_start":
            self.retries += 1

    def _halt(self, reason: str) -> None:
        self.halt_reason = reason
        self.halted.set()

    def _write(self, event: dict) -> None:
        if self.log is not None:
            self.log.write(json.dumps(event) + "\n")
            self.log.flush()


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
    """guard: where pi finds scaffolds/pi_guard.js (the only extension it loads)."""
    argv = [node_path(), str(pi_cli_path()), "--mode", "json", "--no-session", "-nc",
            "--no-extensions", "--extension", guard, "--no-skills", "--no-prompt-templates", "--no-themes",
            "--model", f"{PROVIDER}/{model_id}"]
    if system_prompt is not None:
        argv += ["--system-prompt", system_prompt]
    return argv + [task_prompt]


class Launcher(Protocol):
    """Where pi runs. `start` returns a process whose stdout is pi's event stream; `guard` is
    scaffolds/pi_guard.js as pi sees it."""
    guard: str

    def prepare(self, work: Path, base_url: str) -> tuple[Path, str, str]:
        """Set up the episode's private dir; return (config dir on the host, the same dir as pi
        sees it, base_url as pi must call it)."""
        ...

    def start(self, argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> subprocess.Popen: ...

    def stop(self, proc: subprocess.Popen) -> None: ...

    def cleanup(self) -> None: ...


class HostLauncher:
    """pi as a plain process group on the host, cwd = checkout. Development and tests only:
    nothing confines what the agent runs."""
    guard = str(PI_GUARD)

    def __init__(self, checkout: str | Path, grace_s: float = 2.0):
        self.checkout = Path(checkout)
        self.grace_s = grace_s
        self._marker = ""

    def prepare(self, work, base_url):
        return work / "agent", str(work / "agent"), base_url

    def start(self, argv, env, stderr):
        self._marker = env[MARKER_ENV]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": env["PI_CODING_AGENT_DIR"],
               "LANG": "C.UTF-8", **env}
        return subprocess.Popen(argv, cwd=self.checkout, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)

    def stop(self, proc):
        # SIGTERM first: pi then ends its bash children (they run in their own groups);
        # SIGKILL would orphan them, so stragglers are found by the episode marker.
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        self.cleanup()

    def cleanup(self):
        if self._marker:
            for pid in pids_with_marker(self._marker):
                _signal_pid(pid, signal.SIGKILL)


INSIDE_RUN = "/run/rlvr"              # the episode's private dir inside the sandbox
INSIDE_FORWARDER = "/run/rlvr-forward.py"
INSIDE_GUARD = "/run/rlvr-pi-guard.js"
INSIDE_PORT = 18080                   # the sandbox has its own network namespace: no clashes


class SandboxLauncher:
    """pi inside the episode's sandbox (checkout at /repo, unprivileged uid, no network).

    The policy server is reached through a unix socket in the episode dir (bound at /run/rlvr)
    and a forwarder that listens on 127.0.0.1:INSIDE_PORT inside the sandbox and starts pi.
    Killing the sandbox's process group collapses its pid namespace: nothing survives.
    """
    guard = INSIDE_GUARD

    def __init__(self, sandbox, cpu_s: int | None = None):
        self.sandbox = sandbox
        self.cpu_s = cpu_s
        self._work: Path | None = None
        self._bridge: UnixToTcp | None = None

    def prepare(self, work, base_url):
        parsed = urlsplit(base_url)
        if parsed.scheme != "http" or parsed.hostname is None:
            raise ValueError(f"policy server URL {base_url!r} must be http://host:port/...")
        run_dir = work / "run"
        run_dir.mkdir()
        config_dir = run_dir / "agent"
        config_dir.mkdir()
        self._work = run_dir
        self._bridge = UnixToTcp(str(run_dir / "policy.sock"), parsed.hostname,
                                 parsed.port or 80).start()
        inside_url = urlunsplit(("http", f"127.0.0.1:{INSIDE_PORT}", parsed.path, parsed.query, ""))
        return config_dir, f"{INSIDE_RUN}/agent", inside_url

    def start(self, argv, env, stderr):
        assert self._work is not None, "prepare() first"
        chown_tree(self._work, self.sandbox.uid)  # pi writes into its agent dir
        os.chown(self._work / "policy.sock", 0, 0)  # the socket stays root's (mode 0666)
        inner = [str(sandbox_python_dir() / "bin" / "python"), INSIDE_FORWARDER,
                 "--unix", f"{INSIDE_RUN}/policy.sock", "--port", str(INSIDE_PORT), "--", *argv]
        pi_home = str(rlvr_home() / "pi")
        return self.sandbox.popen(
            inner, env=env, memory_mib=0, cpu_s=self.cpu_s,
            extra_ro_binds=[(pi_home, pi_home), (socket_forward.__file__, INSIDE_FORWARDER),
                            (str(PI_GUARD), INSIDE_GUARD)],
            extra_rw_binds=[(str(self._work), INSIDE_RUN)],
            stdout=subprocess.PIPE, stderr=stderr)

    def stop(self, proc):
        # Sandbox.kill would also close stdout under the reader thread; the group kill is the
        # same: bwrap's death collapses the sandbox's pid namespace.
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()

    def cleanup(self):
        if self._bridge is not None:
            self._bridge.close()
            self._bridge = None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def pids_with_marker(marker: str) -> list[int]:
    """Live processes whose environment carries this episode's marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


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
