"""The GPU step bench's CPU-side parts (bench/gpu_grpo.py, bench/gpu_step.py): the configs its sides
run load, its table prints every side, a step without an update is left out of equal work, the
engine's start-up lines are read, a side is stopped with its whole process tree at the deadline,
and each device call's stages fit the call."""
import json
import time
from pathlib import Path

import pytest

from bench import gpu_grpo, gpu_step
from rl.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _model(tmp_path: Path, model_type: str, gib: float) -> str:
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(int(gib * 2**30))  # sparse: only its size counts
    return str(folder)


@pytest.mark.parametrize("side", ["ours-gpu", "ours-gpu-long", "ours-gpu-recipe"])
@pytest.mark.parametrize("shape", ["3b", "agentic"])
def test_every_side_of_ours_runs_a_config_that_loads(tmp_path, side, shape):
    job = (gpu_grpo.Job(model=_model(tmp_path, "qwen2", 5.8)) if shape == "3b" else
           gpu_grpo.Job(model=_model(tmp_path, "qwen3_5", 8.0), prompts=2, group=4, gen_tokens=1536,
                        prompt_tokens=2560, kv_gib=2.5))
    extra = {"ours-gpu": gpu_grpo.SHORT, "ours-gpu-long": (), "ours-gpu-recipe": gpu_grpo.RECIPE_BEFORE}[side]
    overrides = gpu_grpo.ours_overrides(job, tmp_path / "run", total_gib=80.0, extra=extra)
    cfg = load_config(REPO / gpu_grpo.RECIPE, overrides)
    assert cfg.rollout.ignore_eos and cfg.rollout.max_tokens == job.gen_tokens
    assert cfg.task.kind == "length" and cfg.task.length_prompt_tokens == job.prompt_tokens
    assert cfg.trainer.batch_size * cfg.trainer.group_size * job.gen_tokens == job.tokens_per_step
    assert job.prompt_tokens + job.gen_tokens <= cfg.rollout.max_model_len
    # the learner's cap: what a 24 GiB card leaves beside the awake engine (weights + KV + contexts)
    assert cfg.learner.gpu_memory_fraction * 80.0 == pytest.approx(24.0 - (5.8 if shape == "3b" else 8.0)
                                                                  - job.kv_gib - gpu_grpo.CONTEXTS_GIB, abs=0.01)


def _run(startup, steps, cache="compiled", trained=None, peak=20.0):
    trained = trained or [8] * (len(steps) + 1)
    return {"startup_s": startup, "step_s": steps, "card_peak_gib": peak, "phase_medians": {"time_learn_s": 0.7},
            "startup_split": {"phases": {}, "engine": {"compile_cache": cache}},
            "steps": [{"gen_tokens": 4096, "gen_tokens_per_s": 1500.0, "train_samples": n} for n in trained]}


def test_the_table_prints_every_side_with_each_of_its_starts(capsys):
    meta = {"job": gpu_grpo.asdict(gpu_grpo.Job(model="m")), "tokens_per_step": 4096, "gpu": "card"}
    runs = {"ours-gpu": [_run(70.0, [2.0, 2.2, 2.4]), _run(40.0, [2.1, 2.3, 2.2], cache="read")],
            "trl-gpu": [_run(44.0, [8.0, 9.0, 10.0], cache="none (eager)")],
            "trl-gpu-graphs": [_run(59.0, [4.0, 4.4, 4.2])]}
    summary = gpu_grpo.summarize(meta, runs)
    gpu_grpo.print_table(meta, summary, ["5:ours-gpu: not run (20 s left of --deadline-s 400)"])
    out = capsys.readouterr().out
    for side in runs:
        assert side in out
    assert "70.0 (compiled) / 40.0 (read)" in out and "not run" in out
    ours = summary["ours-gpu"]
    assert ours["startup_s"] == [70.0, 40.0] and ours["steady_step_s"] == pytest.approx(2.2)
    assert ours["ms_per_token"] == pytest.approx(2.2 / 4096 * 1e3)
    assert ours["vs_trl-gpu-graphs"] == pytest.approx(2.2 / 4.2) and ours["vs_trl-gpu"] == pytest.approx(2.2 / 9.0)


def test_a_step_whose_update_was_skipped_is_not_equal_work():
    # records 1..4; step_s[j] ends at record j+1; record 3 trained nothing (every group tied)
    kept, left_out = gpu_grpo.trained_steps(_run(60.0, [2.0, 0.9, 2.2], trained=[8, 8, 0, 8]), samples=8)
    assert kept == [2.0, 2.2] and left_out == 1
    assert gpu_grpo.trained_steps({"step_s": [3.0, 3.1]}, samples=8) == ([3.0, 3.1], 0)  # TRL: always trains


def test_the_engine_start_up_lines_are_read():
    log = """INFO [gpu_model_runner.py:5348] Model loading took 5.79 GiB memory and 3.214 seconds
INFO [backends.py:1094] Using cache directory: /tmp/rlvr-home/vllm-cache/torch_compile_cache/ab12/rank_0_0 for vLLM's torch.compile
INFO [backends.py:293] Directly load the compiled graph(s) for compile range (1, 2048) from the cache, took 2.101 s
INFO [monitor.py:50] torch.compile took 6.42 s in total
INFO [gpu_model_runner.py:6845] Graph capturing finished in 9 secs, took 0.41 GiB
INFO [kv_cache_utils.py:2177] GPU KV cache size: 74,880 tokens
INFO [kv_cache_utils.py:2179] Maximum concurrency for 2,048 tokens per request: 36.56x
INFO [core.py:341] init engine (profile, create kv cache, warmup model) took 21.87 s (compilation: 6.42 s)"""
    got = gpu_grpo.engine_lines(log)
    assert got == {"model_load_s": 3.214, "torch_compile_s": 6.42, "graph_capture_s": 9.0, "engine_init_s": 21.87,
                   "kv_cache_tokens": 74880.0, "max_concurrency": 36.56, "compile_cache": "read",
                   "compile_cache_dir": "/tmp/rlvr-home/vllm-cache/torch_compile_cache/ab12/rank_0_0"}
    assert gpu_grpo.engine_lines("Compiling a graph for compile range (1, 2048) takes 30.1 s\n"
                                 "torch.compile took 41.0 s in total")["compile_cache"] == "compiled"
    assert gpu_grpo.engine_lines("init engine (profile, create kv cache, warmup model) took 9.00 s")[
        "compile_cache"] == "none (eager)"


def test_a_side_past_its_deadline_is_stopped_with_its_children(tmp_path):
    marker = tmp_path / "child.pid"
    t0 = time.monotonic()
    out, rc, timed_out = gpu_grpo.run_bounded(
        ["bash", "-c", f"sleep 60 & echo $! > {marker}; echo started; wait"], gpu_grpo.child_env(), 2, "t")
    assert timed_out and rc != 0 and "started" in out
    assert time.monotonic() - t0 < 20
    child = int(marker.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


@pytest.mark.parametrize("part", ["part1", "part2", "part3"])
def test_each_device_call_fits_its_stages(part):
    names = gpu_step.PARTS[part]
    call_s = 530
    assert sum(gpu_step.LIMITS[n][1] for n in names) <= call_s  # the floors fit
    elapsed = 0.0
    for i, name in enumerate(names):  # every stage using its whole limit still ends inside the call
        limit = gpu_step.stage_limit(names, i, call_s, elapsed)
        assert limit >= gpu_step.LIMITS[name][1] / 2, (name, limit)
        elapsed += limit
    assert elapsed <= call_s
    assert gpu_step.stage_limit(names, 0, 0, 1e6) == gpu_step.LIMITS[names[0]][0]  # no call limit: the cap


def test_a_bench_stopped_from_outside_stops_the_sessions_it_started(tmp_path):
    """A stage past its limit is sent SIGTERM; the sides it runs are in sessions of their own."""
    import os
    import signal
    import subprocess
    import sys

    marker = tmp_path / "side.pid"
    script = ("from bench import gpu_grpo\ngpu_grpo.stop_children_on_term()\n"
              f"gpu_grpo.run_bounded(['bash', '-c', 'sleep 60 & echo $! > {marker}; wait'], gpu_grpo.child_env(), 60, 's')")
    bench = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=gpu_grpo.child_env())
    deadline = time.monotonic() + 30
    while not (marker.is_file() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    side = int(marker.read_text())
    os.kill(bench.pid, signal.SIGTERM)
    assert bench.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(0.5)
    assert not Path(f"/proc/{side}").exists() or "Z" in Path(f"/proc/{side}/stat").read_text().split()[2]


def test_a_run_keeps_every_side_it_could_and_says_why_not_the_rest(tmp_path, monkeypatch, capsys):
    """Sides in order, one failing with the steps it made, one whose records cannot be read, one past
    the deadline: the JSON and the table keep what ran and name what did not."""
    import argparse
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/bash\ncase "$*" in *memory.total*) echo 81559;; *memory.used*) echo 500;;'
                                     ' *name*) echo "Fake H100";; esac\n')
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    calls = []

    def ours(job, left, tag):
        calls.append((tag, left))
        return _run(65.0, [2.0, 2.1, 2.2])

    def trl(job, left, tag):
        calls.append((tag, left))
        raise gpu_grpo.SideFailed("trl stopped at the deadline after 2 step(s)", _run(44.0, [9.0]))

    def broken(job, left, tag):
        calls.append((tag, left))
        time.sleep(1.0)  # the run's deadline comes closer than --min-side-s
        raise KeyError("begin")

    monkeypatch.setattr(gpu_grpo, "SIDES", {"ours-gpu": ours, "trl-gpu": trl, "trl-gpu-graphs": broken})
    out = tmp_path / "run.json"
    a = argparse.Namespace(sides="ours-gpu,trl-gpu,trl-gpu-graphs,ours-gpu", model=_model(tmp_path, "qwen2", 0.01),
                           steps=4, prompts=1, group=8, gen_tokens=512, prompt_tokens=0, kv_gib=2.0, card_gib=24.0,
                           deadline_s=100.0, min_side_s=99.5, json=str(out))
    summary = gpu_grpo.gpu_main(a)
    assert [c[0] for c in calls] == ["1:ours-gpu", "2:trl-gpu", "3:trl-gpu-graphs"]  # the 4th: < 99.5 s left
    saved = json.loads(out.read_text())
    assert saved["meta"]["gpu"] == "Fake H100" and saved["meta"]["tokens_per_step"] == 4096
    assert saved["runs"]["trl-gpu"][0]["failed"] and summary["trl-gpu"]["steady_step_s"] == 9.0
    assert [e.split(":")[0] for e in saved["errors"]] == ["2", "3", "4"]
    assert "KeyError" in saved["errors"][1] and "not run" in saved["errors"][2]
    table = capsys.readouterr().out.split("\n" + "Fake H100")[-1]
    assert "ours-gpu" in table and "trl-gpu" in table and "not measured: 4:ours-gpu: not run" in table
