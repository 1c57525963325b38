"""Which env actor an episode runs on: one with a free slot. Episodes end at different times,
so dealing them round-robin over-fills an actor whose episodes are slow (PoolFull) while
another sits idle; a slot is taken for the episode's whole life and given back when it ends."""
from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager


class EnvSlots:
    def __init__(self, env_actors: list, pool_size: int):
        self._free: queue.Queue = queue.Queue()
        for _ in range(pool_size):
            for actor in env_actors:
                self._free.put(actor)

    @contextmanager
    def take(self) -> Iterator:
        actor = self._free.get()
        try:
            yield actor
        finally:
            self._free.put(actor)
