"""An actor that Ray's memory monitor kills makes the run say so in one line: which actor, the
memory it held, the node's use against the kill threshold, and the resume command.

A fresh Ray (in its own process, so the threshold applies to it alone) gets a kill threshold
1 GB above the node's memory in use at the start; then a real actor allocates past
it. Two ways a kill reaches the loop are covered: a call on the killed actor (the learner's
update: ray.exceptions.OutOfMemoryError) and an actor killed between calls whose death shows
up as some other error (a rollout worker's episodes failing), found through its death cause.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, os, sys, threading, time
from pathlib import Path

total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
meminfo = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/meminfo")}
os.environ["RAY_memory_usage_threshold"] = f"{(total - meminfo['MemAvailable'] + 2**30) / total:.4f}"
os.environ["RAY_memory_monitor_refresh_ms"] = "100"

import ray
from orchestrator.cluster import memory_kill_report, memory_killed_message

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


def eat(chunks):
    for _ in range(60):  # up to 6 GB, written (touched) so it is resident; the monitor stops it long before
        chunks.append(bytearray(b"x") * (100 * 2**20))
        time.sleep(0.02)


@ray.remote(max_restarts=0)
class Hog:
    def __init__(self, in_background=False):
        self.chunks = []
        if in_background:
            threading.Thread(target=eat, args=(self.chunks,), daemon=True).start()

    def train_step(self):
        eat(self.chunks)
        return "survived"

    def ping(self):
        return "alive"


out = {}
learner = Hog.options(name="learner-0").remote()
try:
    out["learner"] = ray.get(learner.train_step.remote())
except Exception as e:
    out["learner_error"] = type(e).__name__
    report = memory_kill_report(e, ["learner-0", "rollout-0"])
    out["learner_message"] = report and memory_killed_message(report, 3, 2, Path(sys.argv[1]))

rollout = Hog.options(name="rollout-0").remote(in_background=True)
deadline = time.time() + 60
while time.time() < deadline:
    try:
        ray.get(rollout.ping.remote())
    except Exception:
        break
    time.sleep(0.5)
failure = RuntimeError("every rollout of step 4 failed; the first: Connection refused")
report = memory_kill_report(failure, ["rollout-0"])
out["rollout_message"] = report and memory_killed_message(report, 4, 3, Path(sys.argv[1]))
out["unrelated"] = memory_kill_report(RuntimeError("a bug"), ["env-0"])
print("@@" + json.dumps(out))
'''


def test_a_memory_killed_actor_is_named_with_its_memory_the_threshold_and_the_resume_command(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(run_dir)], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][2:])
    assert out.get("learner_error") == "OutOfMemoryError", out
    for key, actor, step, ckpt in (("learner_message", "learner-0", 3, 2), ("rollout_message", "rollout-0", 4, 3)):
        msg = out[key]
        assert msg is not None and "\n" not in msg, out
        assert msg.startswith(f"{actor} was killed by Ray's memory monitor during step {step} (it held "), msg
        assert " GB; the node had " in msg and "GB in use, past Ray's kill threshold of " in msg, msg
        assert f"last checkpoint is step {ckpt}" in msg and f"`rlvr train --resume {run_dir.resolve()}`" in msg, msg
    assert out["unrelated"] is None, "an error with no memory kill behind it is not reported as one"
