"""EnvActor on a real Ray cluster: pooled episodes, reuse after finish, isolation of a
crashing episode from its neighbours."""
from __future__ import annotations

import dataclasses

import pytest
import ray

from orchestrator.cluster import spawn_env_actors
from rl.config import RunConfig
from tests.fixtures.env import env_cfg, task_by_qualname, toolz_tasks


@pytest.fixture(scope="module")
def actor():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    [handle] = spawn_env_actors(RunConfig(env=env_cfg(pool_size=2, num_cpus=0.5)))
    yield handle
    ray.get(handle.shutdown.remote())
    ray.shutdown()


@pytest.fixture(scope="module")
def task():
    return task_by_qualname(toolz_tasks(), "frequencies")


def _solve(actor, eid, task):
    return ray.get(actor.call_tool.remote(eid, "edit", {
        "path": task.module_path, "edits": [{"oldText": task.stub_body, "newText": task.original_body}]}))


def test_episode_round_trip_and_reuse(actor, task):
    eid = ray.get(actor.open_episode.remote(dataclasses.asdict(task)))
    assert ray.get(actor.sandbox_cwd.remote(eid)) == "/repo"
    assert ray.get(actor.checkout_path.remote(eid)).endswith("/repo")
    assert not _solve(actor, eid, task).is_error
    ray.get(actor.call_tool.remote(eid, "write", {"path": "notes.txt", "content": "from episode 1"}))
    # a process the scaffold started and never ended
    ray.get(actor.run_in_episode.remote(eid, lambda env: env.sandbox.popen(["sleep", "300"]).pid))
    result = ray.get(actor.finish.remote(eid))
    assert result.reward == 1.0 and result.error is None, result
    assert ray.get(actor.open_count.remote()) == 0
    # the freed slot is reused: fresh checkout, nothing of the previous episode left running
    eid2 = ray.get(actor.open_episode.remote(task))
    seen = ray.get(actor.call_tool.remote(eid2, "bash", {"command": "ls notes.txt; ps -e | grep -c sleep"}))
    assert "No such file" in seen.content
    leftovers = ray.get(actor.run_in_episode.remote(
        eid2, lambda env: __import__("envs.sandbox", fromlist=["x"]).processes_of_uid(env.uid)))
    assert leftovers == []
    assert ray.get(actor.finish.remote(eid2)).reward == 0.0     # no edit this time


def test_pool_size_bounds_open_episodes(actor, task):
    a = ray.get(actor.open_episode.remote(task))
    b = ray.get(actor.open_episode.remote(task))
    with pytest.raises(ray.exceptions.RayTaskError, match="all 2 environments are in use"):
        ray.get(actor.open_episode.remote(task))
    ray.get(actor.close_episode.remote(a))
    c = ray.get(actor.open_episode.remote(task))
    for eid in (b, c):
        ray.get(actor.close_episode.remote(eid))
    assert ray.get(actor.open_count.remote()) == 0


def test_a_crashing_episode_does_not_take_down_its_neighbour(actor, task):
    bad = ray.get(actor.open_episode.remote(task))
    good = ray.get(actor.open_episode.remote(task))
    # hostile and broken calls in one episode ...
    ray.get(actor.call_tool.remote(bad, "bash", {"command": ":(){ :|:& };:", "timeout": 3}))
    ray.get(actor.call_tool.remote(bad, "bash", {"command": "yes", "timeout": 5}))
    assert ray.get(actor.call_tool.remote(bad, "nonsense", None)).is_error
    # ... and its environment destroyed under it
    ray.get(actor.run_in_episode.remote(bad, lambda env: __import__("shutil").rmtree(env.checkout)))
    broken = ray.get(actor.call_tool.remote(bad, "read", {"path": task.module_path}))
    assert broken.is_error
    crashed = ray.get(actor.finish.remote(bad))
    assert crashed.reward == 0.0 and crashed.error, crashed
    # the neighbour is unaffected and the actor keeps serving
    assert not _solve(actor, good, task).is_error
    assert ray.get(actor.finish.remote(good)).reward == 1.0
    with pytest.raises(ray.exceptions.RayTaskError, match="not a task record"):
        ray.get(actor.open_episode.remote({"id": "broken"}))
    assert ray.get(actor.open_count.remote()) == 0
    again = ray.get(actor.open_episode.remote(task))
    ray.get(actor.close_episode.remote(again))


def test_a_killed_actors_mounts_are_swept_by_the_next_holder_of_its_block(tmp_path):
    import subprocess
    from pathlib import Path

    from actors.env_actor import EnvActor
    from rl.config import EnvConfig
    cfg = EnvConfig(work_root=str(tmp_path / "work"))
    first = EnvActor(cfg)
    block = first.work_root.name.split("-")[1]
    first._block_lock.close()  # what a SIGKILL does to the lock; its mounts stay behind
    stale = Path(cfg.work_root) / f"actor-{block}-dead00" / "env-1"
    stale.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(stale)], check=True)
    EnvActor(cfg)
    assert str(stale) not in Path("/proc/mounts").read_text()
    assert not stale.parent.exists()
