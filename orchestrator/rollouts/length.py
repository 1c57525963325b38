"""Single-turn rollouts scored by the length reward: the loop-closure gate's data source."""
from __future__ import annotations

import ray

from orchestrator.rollouts.base import Episode, GroupSpec, step_group_specs
from rl.config import RunConfig
from rl.length_reward import LENGTH_PROMPTS, length_reward
from scaffolds.episode import single_turn_episode


class LengthRollouts:
    def __init__(self, cfg: RunConfig, tokenizer, workers: list):
        self.cfg = cfg
        self.workers = workers
        self.prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=True)["input_ids"]
                        for p in LENGTH_PROMPTS]
        self.names = [f"p{i}" for i in range(len(self.prompts))]

    def group_specs(self, step: int) -> list[GroupSpec]:
        return step_group_specs(step, self.cfg.trainer.batch_size, self.cfg.trainer.seed, self.names)

    def rescue_calls(self, index: int) -> int:
        return 0   # a length prompt has no demonstration to start from

    def run_groups(self, specs: list[GroupSpec], step: int, on_group_done, on_episode_done=None) -> None:
        g, max_tokens = self.cfg.trainer.group_size, self.cfg.rollout.max_tokens
        shards = [specs[i::len(self.workers)] for i in range(len(self.workers))]
        futures = [w.generate.remote([self.prompts[s.index] for s in shard], g, max_tokens)
                   for w, shard in zip(self.workers, shards) if shard]
        for shard, groups in zip([s for s in shards if s], ray.get(futures)):
            for spec, completions in zip(shard, groups):
                runs = [single_turn_episode(c, length_reward(c, max_tokens)) for c in completions]
                episodes = [Episode(spec.group_id, r.record.reward, r.sequences, r.record) for r in runs]
                if on_episode_done is not None:
                    for episode in episodes:
                        on_episode_done(episode)
                on_group_done(episodes)
