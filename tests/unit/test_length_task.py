"""The length task at equal work and at an agent's context shape: the reward of a completion that
ran on past its end token (rollout.ignore_eos), and prompts lengthened to task.length_prompt_tokens."""
import pytest
from transformers import AutoTokenizer

from orchestrator.rollouts.length import length_prompt_ids
from rl.length_reward import LENGTH_PROMPTS, length_reward
from rl.types import Completion

END = 2


def _done(ids, finish):
    return Completion(prompt_token_ids=[1], token_ids=ids, logprobs=[0.0] * len(ids), text="", finish_reason=finish)


def test_a_completion_that_ran_past_its_end_is_scored_where_it_would_have_stopped():
    stopped = _done([5, 6, END], "stop")                # ended at its end token: 3 of 8 tokens
    ran_on = _done([5, 6, END, 7, END, 8, 9, 10], "length")  # the same start, generated on to max_tokens
    assert length_reward(stopped, 8) == length_reward(stopped, 8, {END}) == pytest.approx(1 - 3 / 8)
    assert length_reward(ran_on, 8, {END}) == pytest.approx(1 - 3 / 8)
    assert length_reward(ran_on, 8) == 0.0              # without the end ids: ran out of tokens
    assert length_reward(_done([5] * 8, "length"), 8, {END}) == 0.0  # never ended


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


@pytest.mark.parametrize("tokens", [64, 300, 2560])
def test_every_prompt_is_lengthened_to_exactly_the_tokens_asked(tokenizer, tokens):
    prompts = [length_prompt_ids(tokenizer, q, tokens) for q in LENGTH_PROMPTS]
    assert {len(p) for p in prompts} == {tokens}
    assert len({tuple(p) for p in prompts}) == len(LENGTH_PROMPTS)  # the questions still tell them apart
    bare = length_prompt_ids(tokenizer, LENGTH_PROMPTS[0])
    assert prompts[0][:len(bare) - 6] == bare[:len(bare) - 6]  # the question comes first, in its own turn
    assert prompts[0][-6:] == bare[-6:]                         # and the turn still ends as the template ends it


def test_too_few_tokens_for_the_question_is_refused(tokenizer):
    assert length_prompt_ids(tokenizer, "Say hi.", 0) == length_prompt_ids(tokenizer, "Say hi.")
    with pytest.raises(ValueError, match="task.length_prompt_tokens=10"):
        length_prompt_ids(tokenizer, "Say hi.", 10)
