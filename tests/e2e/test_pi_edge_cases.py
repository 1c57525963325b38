"""The real pi CLI against a scripted OpenAI server: every ugly case ends as a clean, recorded
failure within its wall clock, with no process of the episode left behind."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from envs.sandbox import Sandbox, SandboxUnavailable, check_host, chown_tree
from rl.config import ScaffoldConfig
from scaffolds.pi.episode import run_pi_episode
from scaffolds.pi.install import pi_cli_path
from scaffolds.pi.launch import MARKER_ENV, HostLauncher, SandboxLauncher, pids_with_marker
from tests.fixtures.fake_openai_server import FakeOpenAIServer, http_error, stall, text, tool_call

pytestmark = pytest.mark.skipif(not pi_cli_path().exists(), reason="pi not installed (scripts/setup.sh)")

MODEL = "fake-model"


SANDBOX_UID = 64100  # an unprivileged uid of these tests' own


class Recording:
    """Remembers the episode marker so the test can look for leftovers after the episode."""

    def start(self, argv, env, stderr):
        self.marker = env[MARKER_ENV]
        return super().start(argv, env, stderr)


class RecordingHost(Recording, HostLauncher):
    pass


class RecordingSandbox(Recording, SandboxLauncher):
    pass


@pytest.fixture(params=["host", "sandbox"])
def where(request):
    if request.param == "sandbox":
        try:
            check_host()
        except SandboxUnavailable as e:
            pytest.skip(str(e))
    return request.param


def _launcher(where: str, checkout: Path):
    if where == "host":
        return RecordingHost(checkout)
    chown_tree(checkout, SANDBOX_UID)
    return RecordingSandbox(Sandbox(checkout, uid=SANDBOX_UID))


@pytest.fixture
def episode(where):
    # not pytest's tmp_path: it sits under a 0700 directory the sandbox uid cannot enter
    root = Path(tempfile.mkdtemp(prefix="rlvr-pi-test-"))
    os.chmod(root, 0o755)

    def run(script, **kw):
        return _episode(root, where, script, **kw)
    yield run
    shutil.rmtree(root)


def _episode(tmp_path: Path, where: str, script, wall_clock_s: float = 30.0, max_turns: int = 8,
             retries: int = 0):
    checkout = tmp_path / "checkout"
    checkout.mkdir(exist_ok=True)
    (checkout / "mod.py").write_text("def f():\n    return 1\n")
    launcher = _launcher(where, checkout)
    cfg = ScaffoldConfig(name="pi", wall_clock_s=wall_clock_s, max_turns=max_turns)
    with FakeOpenAIServer(script, model_id=MODEL) as server:
        t0 = time.monotonic()
        outcome = run_pi_episode(launcher, "Fix f in mod.py", server.base_url, MODEL, cfg,
                                 context_window=4096, max_tokens=256, retries=retries,
                                 events_path=tmp_path / "events.jsonl", checkout=checkout)
        elapsed = time.monotonic() - t0
    assert pids_with_marker(launcher.marker) == [], "episode left processes behind"
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert not any(e["type"] == "message_update" for e in events), "quadratic events must not be stored"
    return outcome, elapsed, server.requests, checkout


def test_normal_episode_runs_tool_and_stops(episode):
    script = [tool_call("bash", json.dumps({"command": "echo edited > out.txt"})), text("Done.")]
    outcome, _, requests, checkout = episode(script)
    assert outcome.stop_reason == "stop" and outcome.ok
    assert (outcome.turns, outcome.tool_calls, outcome.tool_failures) == (2, 1, 0)
    assert (checkout / "out.txt").read_text() == "edited\n"
    assert len(requests) == 2, "no extra (e.g. compaction) calls may reach the policy server"
    assert requests[0]["max_completion_tokens"] == 256
    assert [t["function"]["name"] for t in requests[0]["tools"]] == ["read", "bash", "edit", "write"]


def test_http_500_is_recorded_error(episode):
    outcome, elapsed, requests, _ = episode([http_error(500)], retries=1)
    assert outcome.stop_reason == "error" and not outcome.ok
    assert "500" in (outcome.error or "")
    assert outcome.retries == 1 and len(requests) == 2  # pi's one retry, no hidden client retries
    assert elapsed < 30


def test_stalled_stream_hits_wall_clock(episode):
    outcome, elapsed, _, _ = episode([stall()], wall_clock_s=6)
    assert outcome.stop_reason == "wall_clock"
    assert "wall clock" in outcome.error
    assert 6 <= elapsed < 6 + 10


def test_hanging_tool_command_is_killed_with_its_children(episode):
    script = [tool_call("bash", json.dumps({"command": "sleep 300 & sleep 300"})), text("never")]
    outcome, elapsed, _, _ = episode(script, wall_clock_s=6)
    assert outcome.stop_reason == "wall_clock"
    assert elapsed < 6 + 10


def test_tool_call_cut_off_by_length(episode):
    script = [tool_call("write", '{"path": "new.py", "content": "def g(', finish_reason="length")]
    outcome, elapsed, _, _ = episode(script)
    # pi itself would run the truncated call and loop on; the episode must end at the cut
    assert outcome.stop_reason == "length" and not outcome.ok
    assert "max_tokens" in outcome.error
    assert outcome.turns == 1
    assert elapsed < 15


def test_garbage_tool_arguments_become_tool_failure(episode):
    script = [tool_call("edit", "{{{not json at all"), text("I give up.")]
    outcome, _, requests, _ = episode(script)
    assert outcome.stop_reason == "stop"
    assert outcome.tool_failures == 1 and outcome.tool_calls == 1
    tool_msgs = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs, "the failure must be reported back to the model"


@pytest.mark.parametrize("timeout", [0, -3])
def test_bash_timeout_of_zero_or_less_is_refused(episode, timeout):
    """pi would run such a call with no time limit; it is refused, naming the value."""
    script = [tool_call("bash", json.dumps({"command": "echo ran > out.txt", "timeout": timeout})), text("Done.")]
    outcome, _, requests, checkout = episode(script)
    assert outcome.stop_reason == "stop" and outcome.tool_failures == 1
    [reply] = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert f"must be a positive number of seconds, got {timeout}" in str(reply["content"]), reply
    assert not (checkout / "out.txt").exists()


def test_bash_timeout_keeps_pis_meaning(episode):
    script = [tool_call("bash", json.dumps({"command": "sleep 30", "timeout": 1})), text("Done.")]
    outcome, elapsed, requests, _ = episode(script)
    [reply] = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert "Command timed out after 1 seconds" in str(reply["content"]), reply
    assert outcome.tool_failures == 1 and elapsed < 25


def test_turn_cap_ends_looping_agent(episode):
    outcome, _, requests, _ = episode([tool_call("bash", '{"command": "true"}')], max_turns=3)
    assert outcome.stop_reason == "max_turns"
    assert outcome.turns == 3
