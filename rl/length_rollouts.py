"""Single-turn rollouts scored by the length reward: the loop-closure gate's data source."""
from __future__ import annotations

import random

import ray

from rl.config import RunConfig
from rl.episode_store import Episode
from rl.rewards import LENGTH_PROMPTS, length_reward


def epoch_order(n_items: int, seed: int, index: int) -> int:
    """The item at position `index` of a reshuffled-every-epoch stream (stateless cursor)."""
    epoch, offset = divmod(index, n_items)
    order = list(range(n_items))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[offset]


def step_group_specs(step: int, batch_size: int, seed: int, names: list[str]) -> list[tuple[str, int]]:
    """(group id, item index) for the groups of a step: the data cursor is step * batch_size,
    so a resumed run draws exactly the groups the killed one would have."""
    specs = []
    for j in range((step - 1) * batch_size, step * batch_size):
        idx = epoch_order(len(names), seed, j)
        specs.append((f"s{step}-g{j}-{names[idx]}", idx))
    return specs


class LengthRollouts:
    def __init__(self, cfg: RunConfig, tokenizer, workers: list):
        self.cfg = cfg
        self.workers = workers
        self.prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=True)["input_ids"]
                        for p in LENGTH_PROMPTS]

    def group_specs(self, step: int) -> list[tuple[str, int]]:
        return step_group_specs(step, self.cfg.trainer.batch_size, self.cfg.trainer.seed,
                                [f"p{i}" for i in range(len(self.prompts))])

    def run_groups(self, specs: list[tuple[str, int]], step: int, on_group_done) -> None:
        g, max_tokens = self.cfg.trainer.group_size, self.cfg.rollout.max_tokens
        shards = [specs[i::len(self.workers)] for i in range(len(self.workers))]
        futures = [w.generate.remote([self.prompts[idx] for _, idx in shard], g, max_tokens)
                   for w, shard in zip(self.workers, shards) if shard]
        for shard, groups in zip([s for s in shards if s], ray.get(futures)):
            for (group_id, _), completions in zip(shard, groups):
                episodes = []
                for c in completions:
                    tokens = c.prompt_token_ids + c.token_ids
                    n_prompt = len(c.prompt_token_ids)
                    reward = length_reward(c, max_tokens)
                    episodes.append(Episode(
                        group_id=group_id, reward=reward,
                        samples=[{"token_ids": tokens,
                                  "loss_mask": [0] * n_prompt + [1] * len(c.token_ids),
                                  "logprobs": [0.0] * n_prompt + list(c.logprobs)}],
                        record={"reward": reward, "tokens": len(c.token_ids),
                                "clipped": c.finish_reason == "length"}))
                on_group_done(episodes)
