"""The serving format in one place: how a chat request becomes prompt text and token ids (the
policy server), and how a finished conversation becomes training tokens (warm-start rows).

Both go through vLLM's request model and the same chat template call, so a demonstration
trains exactly the tokens the server will show the model and expects back from it:

    calls = conversation_calls(tokenizer, messages, tools)   # one CallRecord per assistant turn
    rows = assemble(calls).samples                            # token ids + loss mask, as in RL

A conversation's assistant turns are rendered the way the model emits them: the template's
text for that message after the generation prompt, up to and including the end-of-turn
token, so the stop is trained; everything else (system, user, tool results, template) is
prompt, loss mask 0. Turn k's prompt continues turn k-1's tokens verbatim, as the server
does when a client sends the history back unchanged.
"""
from __future__ import annotations

from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from actors.tool_parsers import template_messages, template_tools
from rl.config import SERVED_MODEL
from rl.types import CallRecord


def chat_request(messages: list[dict], tools: list[dict] | None, **extra: Any) -> ChatCompletionRequest:
    body = {"model": SERVED_MODEL, "messages": messages, **extra}
    if tools:
        body["tools"] = tools
    return ChatCompletionRequest.model_validate(body)


def render_prompt(tokenizer, request: ChatCompletionRequest) -> str:
    """The prompt text the engine sees for `request` (exactly the policy server's rendering)."""
    return tokenizer.apply_chat_template(
        template_messages(request), tools=template_tools(request), tokenize=False,
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        **(request.chat_template_kwargs or {}))


def continuation_ids(tokenizer, prev_ids: list[int] | None, text: str) -> list[int]:
    """Token ids for a rendered prompt, reusing the previous call's prompt + completion ids.

    When `text` starts with the text of `prev_ids` (the client sent the history back
    unchanged), those exact ids are kept and only the new tail is tokenized: re-tokenizing
    the whole text would often split the same characters differently, and consecutive calls
    could not merge into one training sequence. Otherwise: a plain tokenization.
    """
    if prev_ids:
        prev_text = tokenizer.decode(prev_ids, skip_special_tokens=False)
        if text.startswith(prev_text):
            return prev_ids + tokenizer.encode(text[len(prev_text):], add_special_tokens=False)
    return tokenizer.encode(text, add_special_tokens=False)


def assistant_text(tokenizer, messages: list[dict], tools: list[dict] | None, i: int) -> tuple[str, str]:
    """(prompt text before assistant turn i, the turn's text as the model generates it)."""
    prompt = render_prompt(tokenizer, chat_request(messages[:i], tools, add_generation_prompt=True))
    full = render_prompt(tokenizer, chat_request(messages[:i + 1], tools, add_generation_prompt=False))
    if not full.startswith(prompt):
        raise ValueError(f"the chat template renders assistant turn {i} differently from its generation "
                         "prompt; this template cannot be trained in the serving format")
    eos = tokenizer.eos_token
    tail = full[len(prompt):]
    end = tail.find(eos)
    if end < 0:
        raise ValueError(f"assistant turn {i} renders without the end-of-turn token {eos!r}")
    return prompt, tail[:end + len(eos)]


def conversation_calls(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[CallRecord]:
    """The CallRecords the policy server would have recorded had the model produced every
    assistant turn of `messages` (log-probs 0: not sampled)."""
    calls: list[CallRecord] = []
    prev: list[int] | None = None
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        prompt_text, completion_text = assistant_text(tokenizer, messages, tools, i)
        prompt_ids = continuation_ids(tokenizer, prev, prompt_text)
        completion_ids = tokenizer.encode(completion_text, add_special_tokens=False)
        calls.append(CallRecord(prompt_token_ids=prompt_ids, completion_token_ids=completion_ids,
                                logprobs=[0.0] * len(completion_ids),
                                finish_reason="tool_calls" if msg.get("tool_calls") else "stop",
                                content=msg.get("content") or "", tool_calls=list(msg.get("tool_calls") or [])))
        prev = prompt_ids + completion_ids
    return calls
