"""The one durable-JSONL policy, as every log of the project sees it: a torn last line is
dropped (and cut off before the next append), damage in the middle is refused by file:line."""
from __future__ import annotations

import pytest

from orchestrator.episode_store import EpisodeStore
from orchestrator.metrics import MetricsLog, read_metrics
from orchestrator.rollouts.base import Episode
from rl.jsonl import DamagedLog, append_durable, read_complete
from rl.types import EpisodeRecord, TokenSequence


def test_torn_tail_is_dropped_then_cut_before_the_next_append(tmp_path):
    path = tmp_path / "log.jsonl"
    append_durable(path, [{"a": 1}, {"a": 2}])
    with open(path, "a") as f:
        f.write('{"a": 3, "b"')  # killed mid-write
    assert read_complete(path) == [{"a": 1}, {"a": 2}]
    append_durable(path, [{"a": 4}])
    assert read_complete(path) == [{"a": 1}, {"a": 2}, {"a": 4}]
    assert path.read_text().endswith('{"a": 4}\n')


def test_damage_in_the_middle_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\n{oops\n{"a": 3}\n')
    with pytest.raises(DamagedLog, match=rf"{path}:2 is not a JSON record"):
        read_complete(path)


def test_episode_buffer_and_metrics_share_the_policy(tmp_path):
    store = EpisodeStore(tmp_path)
    episode = Episode("g0", 0.5, [TokenSequence([1, 2], [0, 1], [0.0, -0.3])], EpisodeRecord(0.5, 1, False))
    store.append_group(3, [episode])
    with open(store.dir / "step_000003.jsonl", "a") as f:
        f.write('[{"group_id": "g1"')
    assert store.load_groups(3) == {"g0": [episode]}

    log = MetricsLog(tmp_path, total_steps=3, use_ray_metrics=False)
    for step in (1, 2, 3):
        log.log(step, {"reward_mean": step / 10})
    log.truncate_after(2)
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(DamagedLog, match="metrics.jsonl:2"):
        log.truncate_after(2)
