"""Watching a run without Ray: the tracker's TensorBoard record, the console's bar, summary
and closing table, an actor's output copied to its log file, the placement failure's advice,
and a clipped tool call counted without a traceback."""
import io
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.console_lines import classify
from orchestrator.console import Console, actor_log_tails, final_table, summary_line
from orchestrator.rollouts.base import Episode
from orchestrator.tracker import Tracker, episode_text, pick_samples, scalars, tensorboard_dir
from rl.config import LoggingConfig, load_config
from rl.types import EpisodeRecord, TokenSequence

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_path)


def _episode(tokenizer, reward: float, text: str, **record) -> Episode:
    ids = tokenizer(text)["input_ids"]
    rec = EpisodeRecord(reward=reward, tokens=len(ids), clipped=False, **record)
    return Episode("g0", reward, [TokenSequence(ids, [0] + [1] * (len(ids) - 1), [0.0] * len(ids))], rec)


def test_scalars_take_every_finite_number_nested_keys_by_path():
    metrics = {"reward_mean": 0.5, "loss": None, "time_rollout_s": 3, "note": "x", "nan": math.nan,
               "budget": {"rollout_s": 2.0, "left": {"s": 1}}, "flag": True}
    assert dict(scalars(metrics)) == {"reward_mean": 0.5, "time_rollout_s": 3.0, "budget/rollout_s": 2.0,
                                      "budget/left/s": 1.0, "flag": 1.0}


def test_samples_are_best_and_worst_first(tokenizer):
    eps = [_episode(tokenizer, r, f"answer {r}") for r in (0.2, 1.0, 0.0, 0.5)]
    assert [e.reward for e in pick_samples(eps, 3)] == [1.0, 0.0, 0.5]
    assert [e.reward for e in pick_samples(eps, 9)] == [1.0, 0.0, 0.5, 0.2]
    assert pick_samples(eps, 0) == []


def test_episode_text_says_task_reward_why_and_transcript(tokenizer):
    ep = _episode(tokenizer, 0.0, "<tool_call>\n{\"name\": \"bash\"", task="toolz-take", tool_calls=1,
                  tool_failures=1, stop_reason="max_turns", reward_error="tests failed", unparsed_tool_calls=1)
    text = episode_text(ep, tokenizer.decode)
    assert "`toolz-take`" in text and "**reward** 0.000" in text and "1 failed" in text
    assert "stop: `max_turns`" in text and "reward error: `tests failed`" in text
    assert "unparsed tool calls: `1`" in text
    assert '    {"name": "bash"' in text  # the transcript, verbatim


def test_tracker_writes_every_step_metric_and_sample_episodes(tmp_path, tokenizer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(LoggingConfig(sample_episodes=2), tmp_path)
    for step in (1, 2, 3):
        tracker.log_episodes(step, [_episode(tokenizer, 0.1 * step, "short"), _episode(tokenizer, 0.0, "long")],
                             tokenizer.decode)
        tracker.log_step(step, {"reward_mean": 0.1 * step, "time_budget": {"rollout_s": 10.0 + step}})
    tracker.close()
    [run] = list(tensorboard_dir(tmp_path).iterdir())
    assert run.name == tmp_path.name
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    assert [(s.step, round(s.value, 3)) for s in acc.Scalars("reward_mean")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [s.value for s in acc.Scalars("time_budget/rollout_s")] == [11.0, 12.0, 13.0]
    assert {"episodes/sample_0/text_summary", "episodes/sample_1/text_summary"} <= set(acc.Tags()["tensors"])


def test_no_backend_writes_nothing(tmp_path):
    tracker = Tracker(LoggingConfig(backends=[]), tmp_path)
    tracker.log_step(1, {"reward_mean": 1.0})
    tracker.close()
    assert not tensorboard_dir(tmp_path).exists()


def test_progress_bar_counts_episodes_then_one_summary_line(tokenizer):
    out = io.StringIO()
    console = Console(total_steps=3, stream=out)
    with console.progress(2, total=4, done=1) as episode_done:
        for r in (1.0, 0.0, 0.5):
            episode_done(_episode(tokenizer, r, "x y z"))
    bar = out.getvalue()
    assert "step 2/3" in bar and "4/4" in bar and "reward 0.500" in bar and "tok/s" in bar
    line = summary_line(2, 3, 61.4, {"reward_mean": 0.5, "loss": None, "time_rollout_s": 12.0, "other": 1})
    assert line == "[step 2/3 | 61s] reward_mean=0.5 time_rollout_s=12"


def test_a_resumed_steps_bar_counts_its_reused_episodes(tmp_path, tokenizer):
    """A step killed after its first group resumes with that group from the episode store: the
    bar starts at its 3 episodes and ends at 6/6, not 3/6."""
    from orchestrator.episode_store import EpisodeStore
    from orchestrator.loop import Trainer
    from orchestrator.rollouts.base import step_group_specs

    cfg = load_config(REPO / "configs" / "length.yaml", ["trainer.batch_size=2", "trainer.group_size=3",
                                                         "trainer.sampling.dynamic.enabled=false"])

    def group(spec) -> list[Episode]:
        made = [_episode(tokenizer, r, "a b") for r in (0.0, 0.5, 1.0)]
        return [Episode(spec.group_id, e.reward, e.sequences, e.record) for e in made]

    class Scripted:
        names = ["p0", "p1"]

        def group_specs(self, step):
            return step_group_specs(step, 2, cfg.trainer.seed, self.names)

        def run_groups(self, specs, step, on_group_done, on_episode_done=None):
            for spec in specs:
                episodes = group(spec)
                for e in episodes:
                    on_episode_done(e)
                on_group_done(episodes)

        def rescue_calls(self, index):
            return 0

    trainer = Trainer.__new__(Trainer)
    out = io.StringIO()
    trainer.cfg, trainer.store, trainer.rollouts = cfg, EpisodeStore(tmp_path), Scripted()
    trainer.console = Console(total_steps=1, stream=out)
    trainer.store.append_group(1, group(trainer.rollouts.group_specs(1)[0]))
    sampled = trainer._collect(1)
    assert len(sampled.reused) == 1 and len(sampled.groups) == 2
    assert "(3 reused)" in out.getvalue() and "6/6" in out.getvalue(), out.getvalue()


def test_final_table_names_what_exists(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "reward_curve.png").write_bytes(b"png")
    (tmp_path / "checkpoints" / "step_000003").mkdir(parents=True)
    table = final_table(tmp_path, [{"step": 1, "reward_mean": 0.1}, {"step": 2, "reward_mean": 0.7},
                                   {"step": 3, "reward_mean": 0.5}], 12.0)
    assert "0.100 (step 1) -> 0.500 (step 3); best 0.700 at step 2" in table
    assert f"plot         {tmp_path / 'reward_curve.png'}" in table
    assert "(last: step_000003)" in table
    assert "trace" not in table and "tensorboard" not in table  # neither was written


def test_failure_shows_the_tail_of_each_actor_log(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rollout-0.log").write_text("\n".join(f"line {i}" for i in range(100)))
    tails = actor_log_tails(tmp_path, lines=3)
    assert "rollout-0.log (last 3 lines)" in tails and tails.endswith("line 97\nline 98\nline 99")
    assert actor_log_tails(tmp_path / "none") == ""


def test_actor_output_is_copied_to_its_log_and_still_printed(tmp_path):
    log = tmp_path / "logs" / "rollout-0.log"
    code = ("import os, sys; from actors.logfiles import tee_output; tee_output(); "
            "print('python stdout', flush=True); print('python stderr', file=sys.stderr, flush=True); "
            "os.write(1, b'C-level write\\n'); import time; time.sleep(0.5)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"RLVR_ACTOR_LOG": str(log), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    assert "python stdout" in res.stdout and "C-level write" in res.stdout and "python stderr" in res.stderr
    assert {"python stdout", "python stderr", "C-level write"} <= set(log.read_text().splitlines())


def test_a_lost_node_names_its_actors_the_step_and_the_resume_command(tmp_path):
    from orchestrator.cluster import node_died_message

    msg = node_died_message({"10.0.0.2": ["learner-0", "env-0"]}, 3, 2, tmp_path / "run",
                            RuntimeError("The actor died because its node has died.\nmore"))
    assert msg.startswith("node died during step 3: learner-0, env-0 on 10.0.0.2 went with it (RuntimeError: "
                          "The actor died because its node has died.)")
    assert "last checkpoint is step 2" in msg and f"`rlvr train --resume {tmp_path / 'run'}`" in msg


def test_a_memory_kill_report_becomes_one_line_naming_actor_memory_threshold_and_resume(tmp_path):
    """The memory monitor's report as Ray 2.60 words it (abridged), turned into the run's line."""
    from orchestrator.cluster import memory_killed_message

    report = ("1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 10.0.0.1, "
              "ID: ab12) was 22.41GB used / 23.54GB limit (0.952)\nOOM kill reason: Memory usage 24063819776B "
              "exceeded threshold of 24012373196B (95.0% of 25276182528B limit)\nSelected to kill: (Actor(ff01): "
              "job ID=01000000, task name=learner-0:Learner.train_step, required resources={}, pid=4242, actual "
              "memory used=14.40GB, worker ID=9c)")
    msg = memory_killed_message(report, 10, 9, tmp_path / "run")
    assert msg.startswith("learner-0 was killed by Ray's memory monitor during step 10 (it held 14.4 GB; the node "
                          "had 22.4 GB of its 23.5 GB in use, past Ray's kill threshold of 95%). ")
    assert "\n" not in msg and "last checkpoint is step 9" in msg
    assert f"`rlvr train --resume {(tmp_path / 'run').resolve()}`" in msg


def test_rlvr_train_ends_a_lost_actor_with_its_one_line_not_a_traceback(tmp_path, monkeypatch):
    """ActorLost out of the pipeline: `rlvr train` exits 1 with the message alone (SystemExit
    prints it, no traceback, no chained error)."""
    import cli.doctor
    import orchestrator.pipeline
    from cli.main import main
    from orchestrator.cluster import ActorLost

    def lost(*args, **kwargs):
        try:
            raise RuntimeError("1 worker(s) were killed due to the node running low on memory.\n...")
        except RuntimeError as e:
            raise ActorLost("learner-0 was killed by Ray's memory monitor during step 2 (...)") from e

    monkeypatch.setattr(cli.doctor, "start_preflight", lambda cfg: lambda: None)
    monkeypatch.setattr(orchestrator.pipeline, "run_pipeline", lost)
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(REPO / "configs" / "length.yaml"), f"trainer.run_dir={tmp_path / 'run'}"])
    assert exit_.value.code == "[rlvr] learner-0 was killed by Ray's memory monitor during step 2 (...)"
    assert exit_.value.__suppress_context__


def test_placement_failure_names_the_head_flag_and_the_config_keys():
    from orchestrator.cluster import bundles, placement_failure

    cfg = load_config(REPO / "configs" / "length.yaml", [])
    flat = [b for group in bundles(cfg).values() for b in group]
    msg = placement_failure(cfg, flat, {"CPU": 2.0})
    assert "they need 2.5 CPU; the cluster has 2 CPU" in msg
    assert "ray start --head --num-cpus=3" in msg
    assert "rollout.num_cpus=1 x rollout.num_workers=1" in msg and "env.num_cpus=0.5" in msg


def test_placement_failure_names_the_node_kind_that_lacks_cpus():
    """The README's cluster commands on 2-core nodes: 4 CPUs in all, but the head's roles need 3."""
    from orchestrator.cluster import bundles, placement_failure

    cfg = load_config(REPO / "configs" / "toolz-native.yaml", [
        "ray.role_resources.rollout.head_node=1", "ray.role_resources.learner.head_node=1",
        "ray.role_resources.env.worker_node=1"])
    flat = [b for group in bundles(cfg).values() for b in group]
    nodes = [{"address": "10.0.0.1", "resources": {"CPU": 2.0, "head_node": 100.0}},
             {"address": "10.0.0.2", "resources": {"CPU": 2.0, "worker_node": 100.0}}]
    msg = placement_failure(cfg, flat, {"CPU": 4.0}, nodes)
    assert "the bundles pinned to head_node need 3 CPU; the nodes with head_node have 2 (10.0.0.1: 2)" in msg
    assert "--num-cpus=3" in msg and "worker_node need" not in msg
    msg = placement_failure(cfg, flat, {"CPU": 2.0}, nodes[:1])
    assert "no node offers worker_node" in msg


def test_clipped_tool_call_is_counted_without_a_traceback(tokenizer):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from actors.tool_parsers import ToolCallFormat, unparsed

    fmt = ToolCallFormat(tokenizer, "hermes")
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    vllm_logger = logging.getLogger("vllm.tool_parsers.hermes_tool_parser")
    vllm_logger.addHandler(handler)
    try:
        request = ChatCompletionRequest(model="policy", messages=[{"role": "user", "content": "hi"}], tools=[
            {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {
                "command": {"type": "string"}}}}}])
        text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la /sr'  # clipped mid-string
        content, calls = fmt.parse(request, text, [])
    finally:
        vllm_logger.removeHandler(handler)
    assert calls == [] and unparsed(text, calls)
    assert not [r for r in seen if r.exc_info], "vLLM's traceback for the clipped call reached a handler"
    assert not unparsed("plain answer", []) and not unparsed(text, [{"id": "x"}])


def test_console_line_kinds():
    assert classify("\x1b[36m(RolloutWorker pid=1)\x1b[0m (MainProcess pid=1) ERROR 12-03 10:06:48 [x.py:1] boom") \
        == "error"
    assert classify("\x1b[36m(Learner pid=2)\x1b[0m \rLoading weights: 100%|###| 272/272") == "engine"
    assert classify("[step 1/3 | 109s] reward_mean=0") == "progress"
    assert classify("step 1/3:   0%|  | 0/4 [00:00<?, ?ep/s]\rstep 1/3: 100%|##| 4/4 [00:10<00:00]") == "progress"
    assert classify("bash scripts/setup.sh") == "other"
    assert classify("Traceback (most recent call last):") == "error"


def test_grafana_dashboard_has_a_panel_for_every_gauge():
    from orchestrator.metrics import DASHBOARD_KEYS

    dash = json.loads((REPO / "docs" / "grafana" / "rlvr_dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for key in DASHBOARD_KEYS:
        metric = "ray_rlvr_" + key.replace("/", "_") + "{"
        assert any(metric in e for e in exprs), f"no panel queries {metric}"


def test_final_table_compares_the_band_reward_of_the_first_and_last_steps(tmp_path):
    band = [0.5, 0.25, 0.75, 0.5, 0.5, 0.75, 1.0, 0.75]
    records = [{"step": i + 1, "reward_mean": b, "band/reward_mean": b} for i, b in enumerate(band)]
    table = final_table(tmp_path, records, 1.0)
    assert "first 3 steps 0.500 -> last 3 0.833 (+0.333 +- 0.167 s.e." in table
    short = final_table(tmp_path, records[:5], 1.0)  # 5 steps: the first 2 against the last 2
    assert "first 2 steps 0.375 -> last 2 0.500 (+0.125 +- 0.125 s.e." in short
    assert "band reward" not in final_table(tmp_path, records[:3], 1.0)   # too few steps to compare


def test_held_out_points_join_the_reward_curve(tmp_path):
    from orchestrator.plots import HELDOUT_FILE, record_heldout_point

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n{"step": 2, "reward_mean": 0.6}\n')
    record_heldout_point(tmp_path, 0, 0.60, tmp_path / "ws")
    record_heldout_point(tmp_path, 2, 0.70, tmp_path / "grpo")
    record_heldout_point(tmp_path, 2, 0.65, tmp_path / "grpo")      # the same folder evaluated again
    points = [json.loads(line) for line in (tmp_path / HELDOUT_FILE).read_text().splitlines()]
    assert [(p["step"], p["pass@1"]) for p in points] == [(0, 0.60), (2, 0.65)]
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
