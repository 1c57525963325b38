"""The time budget: an episode's parts add up to its wall time, a step's to the step."""
import pytest

from orchestrator.metrics import step_time_budget, top_time_parts
from rl.types import EPISODE_TIME_PARTS, CallRecord, EpisodeRecord
from scaffolds.episode import time_budget


def call(seconds, queue, prefill, decode, rescore=0.0):
    return CallRecord([1, 2], [3], [-0.1], "stop", seconds=seconds, queue_s=queue, prefill_s=prefill,
                      decode_s=decode, rescore_s=rescore, cached_tokens=1)


def test_episode_parts_hand_numbers():
    calls = [call(3.0, 0.5, 1.0, 1.0, 0.25), call(2.0, 0.0, 0.5, 1.5)]
    b = time_budget(calls, scaffold_s=8.0, reward_s=1.5, total_s=11.0)
    assert set(b) == set(EPISODE_TIME_PARTS)
    assert b == {"queue": 0.5, "prefill": 1.5, "decode": 2.5, "rescore": 0.25, "server": 0.25,
                 "tools": 3.0, "env": 1.5, "reward": 1.5}
    assert sum(b.values()) == pytest.approx(11.0)


def test_step_budget_shares_the_rollout_wall_and_adds_driver_phases():
    parts = dict.fromkeys(EPISODE_TIME_PARTS, 0.0)
    a = EpisodeRecord(1.0, 10, False, seconds=6.0, time_budget={**parts, "decode": 6.0, "tools": 2.0},
                      prompt_tokens=100, cached_tokens=60)
    b = EpisodeRecord(0.0, 10, False, seconds=6.0, time_budget={**parts, "decode": 2.0, "prefill": 6.0},
                      prompt_tokens=100, cached_tokens=20)
    m = step_time_budget([a, b], rollout_s=8.0, phases={"time_learn_s": 3.0, "time_sync_s": 1.0})
    assert m["time/decode_s"] == pytest.approx(4.0) and m["time/prefill_s"] == pytest.approx(3.0)
    assert m["time/tools_s"] == pytest.approx(1.0) and m["time/rescore_s"] == 0.0
    assert sum(v for k, v in m.items() if k.startswith("time/")) == pytest.approx(8.0 + 3.0 + 1.0)
    assert m["rollout/prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert m["rollout/episodes_in_flight"] == pytest.approx(1.5)
    assert top_time_parts(m) == "decode 33% prefill 25% learn 25%"
    assert step_time_budget([EpisodeRecord(0.0, 0, False)], 1.0, {}) == {"time/rollout_s": 1.0}  # single-turn
