"""An episode gets an env actor with a free slot, whatever order the episodes end in: the
round-robin deal it replaces over-filled an actor whose episodes ended late (PoolFull)."""
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from orchestrator.env_slots import EnvSlots


def test_no_actor_holds_more_episodes_than_its_pool_whatever_their_lengths():
    actors, pool_size = ["a", "b", "c"], 4
    slots = EnvSlots(actors, pool_size)
    open_now = dict.fromkeys(actors, 0)
    most = dict.fromkeys(actors, 0)
    lock = threading.Lock()
    rng = random.Random(0)
    lengths = [0.05] + [rng.choice([0.0, 0.0, 0.02]) for _ in range(59)]   # one slow episode among quick ones

    def episode(length: float) -> None:
        with slots.take() as actor:
            with lock:
                open_now[actor] += 1
                most[actor] = max(most[actor], open_now[actor])
            time.sleep(length)
            with lock:
                open_now[actor] -= 1

    with ThreadPoolExecutor(max_workers=len(actors) * pool_size) as pool:
        list(pool.map(episode, lengths))
    assert max(most.values()) <= pool_size and all(v == 0 for v in open_now.values())
    assert sum(most.values()) == len(actors) * pool_size   # every slot was used


def test_a_slot_comes_back_when_its_episode_raises():
    slots = EnvSlots(["a"], 1)
    try:
        with slots.take():
            raise RuntimeError("the episode failed")
    except RuntimeError:
        pass
    with slots.take() as actor:
        assert actor == "a"
