from rl.assembly import assemble
from rl.types import CallRecord


def call(prompt, completion):
    return CallRecord(prompt_token_ids=prompt, completion_token_ids=completion,
                      logprobs=[-0.5] * len(completion), finish_reason="stop")


def test_extending_prompts_merge_with_masked_tool_tokens():
    first = call([1, 2, 3], [10, 11])
    # the next prompt = previous prompt + completion + tool result/template tokens [20, 21]
    second = call([1, 2, 3, 10, 11, 20, 21], [12])
    asm = assemble([first, second])
    assert (asm.merged_calls, asm.split_calls) == (1, 0)
    [s] = asm.samples
    assert s.token_ids == [1, 2, 3, 10, 11, 20, 21, 12]
    assert s.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert s.logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5]


def test_rerendered_history_splits_into_separate_samples():
    first = call([1, 2, 3], [10, 11])
    # the template re-serialized the assistant turn: token 10 became 99 -> no prefix match
    second = call([1, 2, 3, 99, 11, 20], [12, 13])
    asm = assemble([first, second])
    assert (asm.merged_calls, asm.split_calls) == (0, 1)
    assert [s.token_ids for s in asm.samples] == [[1, 2, 3, 10, 11], [1, 2, 3, 99, 11, 20, 12, 13]]
    assert asm.samples[1].loss_mask == [0] * 6 + [1, 1]


def test_calls_without_generated_tokens_yield_no_sample():
    assert assemble([call([1, 2], [])]).samples == []
    assert assemble([]).samples == []
