"""The episode store's group index: later steps read earlier groups from it (the rescue
schedule), also once the step files are gone (a run moved with rlvr pack), and a resumed run
forgets what it sampled past its checkpoint."""
from orchestrator.episode_store import EpisodeStore
from orchestrator.rollouts.base import Episode
from rl.types import EpisodeRecord


def group(gid: str, task: str, rewards: list[float], prefix_calls: int = 0) -> list[Episode]:
    return [Episode(gid, r, [], EpisodeRecord(reward=r, tokens=1, clipped=False, task=task,
                                              prefix_calls=prefix_calls or None)) for r in rewards]


def test_the_index_outlives_the_step_files_and_keeps_a_group_s_last_line(tmp_path):
    store = EpisodeStore(tmp_path)
    store.append_group(1, group("s1-g0", "t", [0.0, 0.0]))
    store.append_group(2, group("s2-g1-rescue2", "t", [1.0, 0.0], prefix_calls=2))
    store.append_group(2, group("s2-g1-rescue2", "t", [1.0, 1.0], prefix_calls=2))  # rolled out again
    for f in store.dir.glob("step_*.jsonl"):
        f.unlink()
    got = EpisodeStore(tmp_path).summaries_before(3)
    assert [(g.step, g.group_id, g.prefix_calls, g.pass_rate) for g in got] == \
        [(1, "s1-g0", 0, 0.0), (2, "s2-g1-rescue2", 2, 1.0)]
    assert EpisodeStore(tmp_path).summaries_before(2) == got[:1]


def test_drop_after_forgets_the_index_lines_past_the_resumed_step(tmp_path):
    store = EpisodeStore(tmp_path)
    for step in (1, 2, 3, 4):
        store.append_group(step, group(f"s{step}-g0", "t", [1.0, 0.0]))
    store.drop_after(2)
    assert [g.step for g in store.summaries_before(10)] == [1, 2, 3]
    assert sorted(p.name for p in store.dir.glob("step_*.jsonl")) == [f"step_00000{i}.jsonl" for i in (1, 2, 3)]


def test_a_run_recorded_before_the_index_is_indexed_from_its_step_files(tmp_path):
    store = EpisodeStore(tmp_path)
    store.append_group(1, group("s1-g0", "t", [0.5, 1.0], prefix_calls=1))
    store.index.unlink()
    assert [(g.group_id, g.rewards) for g in EpisodeStore(tmp_path).summaries_before(2)] == [("s1-g0", (0.5, 1.0))]
