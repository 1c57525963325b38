"""`rlvr monitor` in a real browser: during a real training run (stopped by the test), headless Chromium opens
the viewer and finds the reward curve with at least two points on the page.

RLVR_MONITOR_SCREENSHOT=path keeps the screenshot (docs/results/monitor/ holds one of the page)."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.metrics import read_metrics
from tests.fixtures.headless_browser import Browser, find_chromium

REPO = Path(__file__).resolve().parents[2]
RLVR = [sys.executable, "-m", "cli.main"]
# a loaded 2-core box can take longer than Ray's default to start a node's agent
SLOW_BOX_ENV = {**os.environ, "RAY_agent_register_timeout_ms": "120000", "RAY_raylet_start_wait_time_s": "120"}
# every scalar card on the page: its tag and the vertices of its drawn line (SVG renderer)
CARDS_JS = """(() => [...document.querySelectorAll('scalar-card')].map(c => ({
  tag: (c.querySelector('.tag') || c.querySelector('[title]') || {}).title || null,
  points: Math.max(0, ...[...c.querySelectorAll('line-chart path')].filter(p => p.style.fill === 'none')
                      .map(p => ((p.getAttribute('d') || '').match(/[ML]/g) || []).length))})))()"""


# far more steps than the check needs: the test stops the run itself, so a fast machine cannot
# finish training before the page has drawn its curve
STEPS = 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode}")
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the training driver shuts its Ray down on the way out
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_monitor_shows_the_live_reward_curve_in_a_browser(tmp_path, model_path):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium binary on PATH (Debian: apt-get install chromium)")
    run_dir, port, console = tmp_path / "run", free_port(), tmp_path / "console.txt"
    with console.open("w") as out:
        train = subprocess.Popen([*RLVR, "train", str(REPO / "configs" / "length.yaml"), f"trainer.run_dir={run_dir}",
                                  f"trainer.steps={STEPS}", "trainer.batch_size=2", "trainer.group_size=4"],
                                 cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=SLOW_BOX_ENV)
    monitor = browser = None
    try:
        _wait(run_dir.is_dir, 120, "the run directory", train)
        monitor = subprocess.Popen([*RLVR, "monitor", str(run_dir), "--port", str(port)], cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: len(read_metrics(run_dir)) >= 2, 600, "two logged steps", train)
        browser = Browser(chromium)
        drawn = lambda cs: any(c["tag"] == "reward_mean" and c["points"] >= 2 for c in cs or [])  # noqa: E731
        deadline, cards = time.time() + 240, None
        while time.time() < deadline and not drawn(cards):
            # (re)load the page: a first load on a busy machine can draw the card before its data
            browser.open(f"http://127.0.0.1:{port}/?forceSVG=true&tagFilter=%5Ereward_mean%24#timeseries")
            cards = browser.wait_for(CARDS_JS, drawn, timeout=30)
        still_training = train.poll() is None
        shot = browser.screenshot(Path(os.environ.get("RLVR_MONITOR_SCREENSHOT") or tmp_path / "monitor.png"))
        assert any(c["tag"] == "reward_mean" and c["points"] >= 2 for c in cards or []), cards
        assert still_training, "the run ended before the page showed its curve (not a live view)"
        assert shot.stat().st_size > 10_000
    finally:
        if browser is not None:
            browser.close()
        if monitor is not None:
            monitor.terminate()
            monitor.wait(timeout=60)
        _stop(train)
    output = console.read_text()
    print(output[-3000:])
    assert re.search(rf"\[step 2/{STEPS} \| \d+s\] reward_mean=", output), output[-3000:]
