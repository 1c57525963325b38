"""Single-turn rollouts scored by the length reward: the loop-closure gate's data source."""
from __future__ import annotations

import ray

from orchestrator.rollouts.base import Episode, GroupSpec, step_group_specs
from rl.config import RunConfig
from rl.length_reward import LENGTH_PROMPTS, length_reward
from rl.types import EpisodeRecord, TokenSequence


class LengthRollouts:
    def __init__(self, cfg: RunConfig, tokenizer, workers: list):
        self.cfg = cfg
        self.workers = workers
        self.prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=True)["input_ids"]
                        for p in LENGTH_PROMPTS]

    def group_specs(self, step: int) -> list[GroupSpec]:
        return step_group_specs(step, self.cfg.trainer.batch_size, self.cfg.trainer.seed,
                                [f"p{i}" for i in range(len(self.prompts))])

    def run_groups(self, specs: list[GroupSpec], step: int, on_group_done) -> None:
        g, max_tokens = self.cfg.trainer.group_size, self.cfg.rollout.max_tokens
        shards = [specs[i::len(self.workers)] for i in range(len(self.workers))]
        futures = [w.generate.remote([self.prompts[s.index] for s in shard], g, max_tokens)
                   for w, shard in zip(self.workers, shards) if shard]
        for shard, groups in zip([s for s in shards if s], ray.get(futures)):
            for spec, completions in zip(shard, groups):
                episodes = []
                for c in completions:
                    n_prompt = len(c.prompt_token_ids)
                    reward = length_reward(c, max_tokens)
                    sequence = TokenSequence(token_ids=c.prompt_token_ids + c.token_ids,
                                             loss_mask=[0] * n_prompt + [1] * len(c.token_ids),
                                             logprobs=[0.0] * n_prompt + list(c.logprobs))
                    record = EpisodeRecord(reward=reward, tokens=len(c.token_ids),
                                           clipped=c.finish_reason == "length")
                    episodes.append(Episode(spec.group_id, reward, [sequence], record))
                on_group_done(episodes)
