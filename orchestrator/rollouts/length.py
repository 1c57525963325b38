"""Single-turn rollouts scored by the length reward: the loop-closure gate's data source."""
from __future__ import annotations

import ray

from orchestrator.rollouts.base import Episode, GroupSpec, step_group_specs
from rl.config import RunConfig
from rl.length_reward import LENGTH_PROMPTS, length_reward
from scaffolds.episode import single_turn_episode

# the filler of task.length_prompt_tokens: source lines, numbered so no two stretches read alike
FILLER_LINE = "def helper_{i}(value):\n    return value * {i} + {j}\n\n"


def length_prompt_ids(tokenizer, question: str, tokens: int = 0) -> list[int]:
    """The question as a chat prompt; with tokens > 0, a filler document follows it in the same
    turn so the prompt is that many tokens long (an agent's context shape): exactly, where a cut
    of the filler at a token boundary encodes back to itself, else the nearest length below."""
    def chat(content: str) -> list[int]:
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]

    bare = chat(question)
    if tokens == 0:
        return bare
    if tokens < len(bare) + 8:
        raise ValueError(f"task.length_prompt_tokens={tokens} leaves no room for a filler: the prompt {question!r} "
                         f"alone is {len(bare)} tokens")
    lines = 64
    while len(filler := tokenizer.encode("".join(FILLER_LINE.format(i=i, j=i % 7) for i in range(lines)),
                                         add_special_tokens=False)) < tokens:
        lines *= 2
    n, best = tokens - len(bare), bare
    for _ in range(8):
        got = chat(f"{question}\n\n{tokenizer.decode(filler[:n])}")
        if len(got) == tokens:
            return got
        if len(best) < len(got) < tokens:
            best = got
        n = max(0, n + tokens - len(got))
    return best


class LengthRollouts:
    def __init__(self, cfg: RunConfig, tokenizer, workers: list):
        self.cfg = cfg
        self.workers = workers
        self.prompts = [length_prompt_ids(tokenizer, p, cfg.task.length_prompt_tokens) for p in LENGTH_PROMPTS]
        self.names = [f"p{i}" for i in range(len(self.prompts))]
        # what ends a completion: with rollout.ignore_eos it runs on past these, and is scored at the first
        self.end_ids = frozenset(i for i in (tokenizer.eos_token_id,) if i is not None)

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
                runs = [single_turn_episode(c, length_reward(c, max_tokens, self.end_ids)) for c in completions]
                episodes = [Episode(spec.group_id, r.record.reward, r.sequences, r.record) for r in runs]
                if on_episode_done is not None:
                    for episode in episodes:
                        on_episode_done(episode)
                on_group_done(episodes)
