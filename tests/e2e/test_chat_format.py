"""The serving format: a real episode's messages, rendered by actors.chat_format, give the token
ids the policy server recorded for it: every prompt, and the model's own tokens where the
engine sampled freely. A grammar-constrained (tool_choice "required") call is the exception,
checked separately: the grammar can force a text through a token split that plain tokenization
never produces (measured: 48 recorded vs 43 canonical tokens for the same call), so there the
rendering must give the same call, not the same split."""
from __future__ import annotations

import json

import pytest

from rl.config import ModelConfig, RolloutConfig
from scaffolds.system_prompt import render_system_prompt

READ_TOOL = {"type": "function", "function": {
    "name": "read", "description": "Read the contents of a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "file to read"}},
                   "required": ["path"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def worker(model_path):
    from actors.rollout_worker import RolloutWorker
    w = RolloutWorker(model_path, RolloutConfig(max_model_len=2048, max_tokens=160, temperature=0.0),
                      ModelConfig(tool_call_parser="hermes"), enable_lora=False)
    yield w
    w.shutdown()


def _differences(what: str, got: list[int], want: list[int]) -> list[str]:
    if got == want:
        return []
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return [f"{what}: first difference at token {at} (rendered {got[at:at + 5]}, recorded {want[at:at + 5]}); "
            f"lengths {len(got)} vs {len(want)}"]


def test_rendered_episode_equals_recorded_tokens(worker):
    from openai import OpenAI

    from actors.chat_format import conversation_calls

    base = worker.start_server()
    client = OpenAI(base_url=f"{base}/episodes/fmt/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "system", "content": render_system_prompt("/repo")},
                {"role": "user", "content": "Read the file notes.txt and tell me what it says."}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[READ_TOOL],
                                           tool_choice="required").choices[0]
    assert first.message.tool_calls, first
    call = first.message.tool_calls[0]
    messages.append({"role": "assistant", "content": first.message.content or "",
                     "tool_calls": [{"id": call.id, "type": "function",
                                     "function": {"name": call.function.name,
                                                  "arguments": call.function.arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "The meeting moved to Friday."})
    second = client.chat.completions.create(model="policy", messages=messages, tools=[READ_TOOL],
                                            tool_choice="none").choices[0]
    assert second.finish_reason == "stop", "the answer must end with the end-of-turn token"
    messages.append({"role": "assistant", "content": second.message.content})

    recorded = worker.take_episode_calls("fmt")
    rendered = conversation_calls(worker.tokenizer, messages, [READ_TOOL])
    assert len(rendered) == len(recorded) == 2
    diffs = []
    for i, (r, w) in enumerate(zip(rendered, recorded)):
        diffs += _differences(f"call {i} prompt", r.prompt_token_ids, w.prompt_token_ids)
    diffs += _differences("call 1 model tokens (unconstrained)", rendered[1].completion_token_ids,
                          recorded[1].completion_token_ids)
    assert not diffs, "\n".join(diffs) + "\n" + json.dumps(messages, indent=1)[:2000]
    # the guided call: the same tool call, whatever the split
    got = recorded[0].tool_calls[0]["function"]
    text = worker.tokenizer.decode(rendered[0].completion_token_ids)
    body = json.loads(text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0])
    assert body == {"name": got["name"], "arguments": json.loads(got["arguments"])}
    assert rendered[-1].completion_token_ids[-1] == worker.tokenizer.eos_token_id   # the stop is trained


def test_recording_proxy_renders_what_the_server_recorded(worker, model_path):
    """Harvest against another endpoint: the proxy forwards (streamed and not) and renders the
    conversation in the trained model's format; with this server upstream, that equals the
    server's own record on every prompt and on the unconstrained call's tokens."""
    from openai import OpenAI

    from actors.recording_proxy import RecordingProxy

    base = worker.start_server()
    proxy = RecordingProxy(f"{base}/episodes/up/v1", "policy", None, model_path)
    client = OpenAI(base_url=f"{proxy.start()}/episodes/p/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        messages = [{"role": "system", "content": render_system_prompt("/repo")},
                    {"role": "user", "content": "Read the file notes.txt and tell me what it says."}]
        stream = client.chat.completions.create(model="x", messages=messages, tools=[READ_TOOL],
                                                tool_choice="required", stream=True)
        name, args, call_id = "", "", ""
        for chunk in stream:
            deltas = (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []
            for tc in deltas:
                call_id = tc.id or call_id
                name += tc.function.name or ""
                args += tc.function.arguments or ""
        assert name == "read", (name, args)
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "The meeting moved to Friday."})
        second = client.chat.completions.create(model="x", messages=messages, tools=[READ_TOOL],
                                                tool_choice="none").choices[0]
        assert second.finish_reason == "stop"
        rendered = proxy.take_episode_calls("p")
        recorded = worker.take_episode_calls("up")
    finally:
        proxy.shutdown()
    assert len(rendered) == len(recorded) == 2
    diffs = []
    for i, (r, w) in enumerate(zip(rendered, recorded)):
        diffs += _differences(f"call {i} prompt", r.prompt_token_ids, w.prompt_token_ids)
    diffs += _differences("call 1 model tokens", rendered[1].completion_token_ids, recorded[1].completion_token_ids)
    assert not diffs, "\n".join(diffs)
    assert proxy.take_episode_calls("p") == []      # taken once, like the server's record


@pytest.mark.parametrize("content", ["I'll find the function.\n", "I'll find the function.", "", "Two lines.\n\n"])
def test_a_tool_call_turn_renders_as_the_model_wrote_it(model_path, content):
    """The model writes `text\\n<tool_call>`; the hermes parser keeps the newline in the content,
    and a client may send it back with or without it. The history must render the tokens the
    model produced, else the next call's prompt does not extend the last one and the episode
    splits into samples that each re-process the shared prefix."""
    from transformers import AutoTokenizer

    from modeling.default_model import TEMPLATE

    tok = AutoTokenizer.from_pretrained(model_path)
    call = {"name": "read", "arguments": {"path": "notes.txt"}}
    messages = [{"role": "user", "content": "Read notes.txt."}]
    prompt = tok.apply_chat_template(messages, tools=[READ_TOOL], chat_template=TEMPLATE.read_text(),
                                     add_generation_prompt=True, tokenize=False)
    wrote = content if not content or content.endswith("\n") else content + "\n"   # what preceded <tool_call>
    generated = wrote + '<tool_call>\n{"name": "read", "arguments": {"path": "notes.txt"}}\n</tool_call><|im_end|>\n'
    history = messages + [{"role": "assistant", "content": content,
                           "tool_calls": [{"type": "function", "function": call}]}]
    rendered = tok.apply_chat_template(history, tools=[READ_TOOL], chat_template=TEMPLATE.read_text(), tokenize=False)
    assert rendered == prompt + generated


def test_a_folder_built_with_an_older_template_gets_the_current_one(tmp_path):
    from modeling.default_model import TEMPLATE, refresh_template

    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    refresh_template(tmp_path)
    assert (tmp_path / "chat_template.jinja").read_text() == TEMPLATE.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat_template.jinja"]
