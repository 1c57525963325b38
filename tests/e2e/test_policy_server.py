"""Policy server: OpenAI client -> per-episode routes -> real vLLM engine, with recording."""
from __future__ import annotations

import json
import math
import threading

import httpx
import pytest

from rl.config import ModelConfig, RolloutConfig

# Keys in the order vLLM's request model dumps them, so a plain render of these dicts is
# byte-identical to what the server renders.
READ_TOOL = {"type": "function", "function": {
    "name": "read", "description": "Read the contents of a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "file to read"}},
                   "required": ["path"], "additionalProperties": False}, "strict": True}}
BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"], "additionalProperties": False}, "strict": True}}


@pytest.fixture(scope="module")
def worker(model_path):
    from actors.rollout_worker import RolloutWorker
    cfg = RolloutConfig(max_model_len=1024, max_tokens=48, temperature=0.7)
    w = RolloutWorker(model_path, cfg, ModelConfig(tool_call_parser="hermes"), enable_lora=False)
    w.start_server()
    yield w
    w.shutdown()


@pytest.fixture(scope="module")
def base(worker) -> str:
    return worker.start_server()


def client(base: str, episode: str):
    from openai import OpenAI
    return OpenAI(base_url=f"{base}/episodes/{episode}/v1", api_key="unused", max_retries=0, timeout=120)


# --- parsers on fixed text ------------------------------------------------------------
def _request(tools, tool_choice="auto"):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                 "tools": tools, "tool_choice": tool_choice})


def _stream_through(fmt, request, text: str, tokenizer, piece: int = 3):
    """Feed text to a fresh streaming parser in small pieces; return (content, {index: [name, args]})."""
    parser = fmt.parser(request)
    content, calls = "", {}
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [ids[i:i + piece] for i in range(0, len(ids), piece)]
    for k, chunk in enumerate(pieces):
        delta = parser.parse_delta(tokenizer.decode(chunk), chunk, request, [], finished=k == len(pieces) - 1)
        if delta is None:
            continue
        content += delta.content or ""
        for tc in delta.tool_calls:
            entry = calls.setdefault(tc.index, ["", ""])
            if tc.function and tc.function.name:
                entry[0] += tc.function.name
            if tc.function and tc.function.arguments:
                entry[1] += tc.function.arguments
    return content, calls


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_path)


def test_hermes_parser_fixed_text(tokenizer):
    from actors.tool_parsers import ToolCallFormat
    fmt = ToolCallFormat(tokenizer, "hermes")
    text = ('Let me look.\n<tool_call>\n{"name": "read", "arguments": {"path": "src/a.py"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>')
    request = _request([READ_TOOL, BASH_TOOL])
    content, calls = fmt.parse(request, text, [])
    assert content.strip() == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("read", {"path": "src/a.py"}), ("bash", {"command": "ls -la"})]
    s_content, s_calls = _stream_through(fmt, request, text, tokenizer)
    assert s_content.strip() == "Let me look."
    assert [(n, json.loads(a)) for n, a in (s_calls[0], s_calls[1])] == \
        [("read", {"path": "src/a.py"}), ("bash", {"command": "ls -la"})]
    assert fmt.parse(request, "no tools here", [])[1] == []


def test_qwen3_xml_parser_fixed_text(tokenizer):
    from actors.tool_parsers import ToolCallFormat
    fmt = ToolCallFormat(tokenizer, "qwen3_xml")
    text = ("I will read it.\n<tool_call>\n<function=read>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
            "</function>\n</tool_call>")
    request = _request([READ_TOOL])
    content, calls = fmt.parse(request, text, tokenizer.encode(text, add_special_tokens=False))
    assert (content or "").strip() == "I will read it."
    assert len(calls) == 1 and calls[0]["function"]["name"] == "read"
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "src/a.py"}
    s_content, s_calls = _stream_through(fmt, request, text, tokenizer)
    assert s_content.strip() == "I will read it."
    assert s_calls[0][0] == "read" and json.loads(s_calls[0][1]) == {"path": "src/a.py"}


def test_unknown_parser_is_rejected(tokenizer):
    from actors.tool_parsers import ToolCallFormat
    with pytest.raises(ValueError, match="model.tool_call_parser"):
        ToolCallFormat(tokenizer, "pythonic")


# --- the server with the real engine -----------------------------------------------------
def _render(worker, messages, tools=None) -> list[int]:
    text = worker.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return worker.tokenizer.encode(text, add_special_tokens=False)


def test_streaming_tool_call_is_parsed_and_recorded_exactly(worker, base):
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Show me the file src/app.py"}]
    stream = client(base, "ep-tools").chat.completions.create(
        model="policy", messages=messages, tools=[READ_TOOL, BASH_TOOL],
        tool_choice={"type": "function", "function": {"name": "read"}},
        stream=True, stream_options={"include_usage": True}, max_tokens=4096)
    names, args, finish, usage, n_chunks = {}, {}, None, None, 0
    for chunk in stream:
        n_chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.function.name:
                    names[tc.index] = tc.function.name
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
            finish = ch.finish_reason or finish
    assert n_chunks > 3, "the response was not streamed"
    assert names == {0: "read"}
    assert isinstance(json.loads(args[0])["path"], str)
    assert finish == "stop"  # OpenAI's convention for a named tool choice

    (rec,) = worker.take_episode_calls("ep-tools")
    assert rec.tool_calls[0]["function"]["name"] == "read"
    assert json.loads(rec.tool_calls[0]["function"]["arguments"]) == json.loads(args[0])
    assert rec.prompt_token_ids == _render(worker, messages, [READ_TOOL, BASH_TOOL])
    assert usage.prompt_tokens == len(rec.prompt_token_ids)
    assert usage.completion_tokens == len(rec.completion_token_ids) == len(rec.logprobs)
    assert "<tool_call>" in worker.tokenizer.decode(rec.completion_token_ids)
    # max_tokens=4096 was clamped (48 by config), not rejected
    assert len(rec.completion_token_ids) <= 48
    # guided decoding: the masked distribution's log-probs are not recorded; the learner's stand in
    assert all(math.isnan(lp) for lp in rec.logprobs) and rec.rescore_s == 0.0
    # the engine's own timings of the call
    assert rec.prefill_s > 0 and rec.decode_s > 0 and rec.queue_s >= 0
    assert rec.queue_s + rec.prefill_s + rec.decode_s <= rec.seconds


def test_rescore_mode_records_the_unconstrained_logprobs(worker, base):
    """rollout.guided_logprobs=rescore: a guided call's log-probs come from a second pass,
    equal to the served policy's prompt log-probs of the same tokens."""
    served = worker._server.cfg       # the server's own copy (its bind address resolved)
    served.guided_logprobs = "rescore"
    try:
        client(base, "ep-rescore").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Show me src/app.py"}], tools=[READ_TOOL],
            tool_choice={"type": "function", "function": {"name": "read"}})
    finally:
        served.guided_logprobs = "learner"
    (rec,) = worker.take_episode_calls("ep-rescore")
    assert rec.rescore_s > 0
    scored = worker.prompt_logprobs(rec.prompt_token_ids + rec.completion_token_ids)[len(rec.prompt_token_ids):]
    assert max(abs(a - b) for a, b in zip(scored, rec.logprobs)) < 1e-3


def test_required_tool_choice_streams_a_call(worker, base):
    stream = client(base, "ep-req").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "List the files here."}],
        tools=[READ_TOOL, BASH_TOOL], tool_choice="required", stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, ["", ""])
                entry[0] += tc.function.name or ""
                entry[1] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    (rec,) = worker.take_episode_calls("ep-req")
    assert calls and calls[0][0] in ("read", "bash")
    assert finish in ("tool_calls", "length")
    assert rec.tool_calls or rec.finish_reason == "length"
    if rec.tool_calls:
        assert [c["function"]["name"] for c in rec.tool_calls] == [calls[i][0] for i in sorted(calls)]


def test_plain_chat_non_streaming_and_episode_routing(worker, base):
    a = client(base, "ep-a").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, n=2)
    b = client(base, "ep-b").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Count to three."}], max_tokens=8)
    assert len(a.choices) == 2 and len(b.choices) == 1
    rec_a, rec_b = worker.take_episode_calls("ep-a"), worker.take_episode_calls("ep-b")
    assert len(rec_a) == 2 and len(rec_b) == 1
    assert worker.take_episode_calls("ep-a") == []
    for choice, rec in zip(a.choices, rec_a):
        assert choice.message.content == rec.content
        assert 1 <= len(rec.completion_token_ids) <= 8 and len(rec.logprobs) == len(rec.completion_token_ids)
    assert a.usage.completion_tokens == sum(len(r.completion_token_ids) for r in rec_a)
    assert rec_b[0].prompt_token_ids == _render(worker, [{"role": "user", "content": "Count to three."}])
    # unguided: the recorded logprobs are the engine's sampled ones, equal to the policy's scoring
    rec = rec_b[0]
    scored = worker.prompt_logprobs(rec.prompt_token_ids + rec.completion_token_ids)[len(rec.prompt_token_ids):]
    assert max(abs(x - y) for x, y in zip(scored, rec.logprobs)) < 1e-3


def test_tool_history_renders_and_concurrent_episodes_are_kept_apart(worker, base):
    history = [{"role": "user", "content": "Read a.py"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "def f():\n    return 1\n"}]
    errors: list[BaseException] = []

    def episode(i: int) -> None:
        try:
            resp = client(base, f"ep-c{i}").chat.completions.create(
                model="policy", messages=history, tools=[READ_TOOL], stream=i % 2 == 0, max_tokens=12)
            if i % 2 == 0:
                for _ in resp:  # read the stream to its end, as a scaffold does
                    pass
        except BaseException as e:  # surfaced below, with the episode that failed
            errors.append(e)

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    expected_prompt = _render(worker, [history[0], {**history[1], "tool_calls": [
        {**history[1]["tool_calls"][0], "function": {"name": "read", "arguments": {"path": "a.py"}}}]}, history[2]],
        [READ_TOOL])
    for i in range(4):
        (rec,) = worker.take_episode_calls(f"ep-c{i}")
        assert rec.prompt_token_ids == expected_prompt
    assert "<tool_response>" in worker.tokenizer.decode(expected_prompt)


def test_history_sent_back_reuses_the_generated_tokens_so_calls_merge(worker, base):
    """A second call whose history repeats the first reply continues its exact token ids."""
    from rl.assembly import assemble
    c = client(base, "ep-merge")
    rules = " ".join(f"Rule {i}: answer with one short word." for i in range(40))  # a few KV blocks long
    messages = [{"role": "system", "content": rules}, {"role": "user", "content": "Name a fruit."}]
    first = c.chat.completions.create(model="policy", messages=messages, max_tokens=12)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Another one."}]
    c.chat.completions.create(model="policy", messages=messages, max_tokens=12)
    calls = worker.take_episode_calls("ep-merge")
    prev = calls[0].prompt_token_ids + calls[0].completion_token_ids
    assert calls[1].prompt_token_ids[:len(prev)] == prev
    # ...so the engine's prefix cache serves turn 1's tokens: turn 2 prefills little more than its new ones
    # (the cache works in whole KV blocks: at most one block of turn 1 is recomputed)
    assert calls[1].cached_tokens >= len(prev) - 128 > 0
    # the tail (template + new user turn) is a plain render of the same text
    assert worker.tokenizer.decode(calls[1].prompt_token_ids) == worker.tokenizer.decode(_render(worker, messages))
    asm = assemble(calls)
    assert (asm.merged_calls, asm.split_calls, len(asm.samples)) == (1, 0, 1)


def test_config_sampling_overrides_the_client(worker):
    server = worker._server
    _, _, params, n = server.prepare({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                      "temperature": 0.0, "top_p": 0.1, "seed": 7, "n": 3, "max_tokens": 10**6})
    assert (params.temperature, params.top_p, params.seed, n) == (0.7, 1.0, None, 3)
    assert params.logprobs == 0 and params.max_tokens == 48


def test_bad_requests_get_clear_errors(base, worker):
    url = f"{base}/episodes/ep-bad/v1/chat/completions"
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(url, json={"model": "m"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    long = "word " * 2000
    r = httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and "rollout.max_model_len" in r.json()["error"]["message"]
    r = httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                              "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [READ_TOOL]})
    assert r.status_code == 400
    assert worker.take_episode_calls("ep-bad") == []
    assert httpx.get(f"{base}/episodes/ep-bad/v1/models").json()["data"][0]["id"] == worker.model_path


def test_scripted_turns_are_served_recorded_and_never_trained(worker, base):
    """A rescue prefix: the episode's first calls are answered with a demonstration's assistant
    messages (streamed and not), recorded as scripted, and the next call is the engine's. The
    assembled sequence holds all three, with loss mask 0 on the scripted turns' tokens only."""
    from rl.assembly import assemble

    call = {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    script = [{"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
              {"role": "assistant", "content": "Reading it.", "tool_calls": [
                  {"id": "call_1", "type": "function",
                   "function": {"name": "read", "arguments": '{"path": "src/app.py"}'}}]}]
    worker.script_episode("ep-rescue", script)
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix src/app.py"}]
    c = client(base, "ep-rescue")
    first = c.chat.completions.create(model="policy", messages=messages, tools=[READ_TOOL, BASH_TOOL])
    msg = first.choices[0].message
    assert msg.content == "Let me look." and msg.tool_calls[0].function.name == "bash"
    assert first.choices[0].finish_reason == "tool_calls"
    messages += [{"role": "assistant", "content": msg.content, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_0", "content": "src\n"}]
    names, args, text = {}, {}, ""
    for chunk in c.chat.completions.create(model="policy", messages=messages, tools=[READ_TOOL, BASH_TOOL],
                                           stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                names[tc.index] = tc.function.name
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert text == "Reading it." and names == {0: "read"} and json.loads(args[0]) == {"path": "src/app.py"}
    messages += [script[1], {"role": "tool", "tool_call_id": "call_1", "content": "def app():\n    return 1\n"}]
    c.chat.completions.create(model="policy", messages=messages, tools=[READ_TOOL, BASH_TOOL], max_tokens=8)

    records = worker.take_episode_calls("ep-rescue")
    assert [r.scripted for r in records] == [True, True, False]
    assert "Let me look." in worker.tokenizer.decode(records[0].completion_token_ids)
    # The engine's call has its own log-probs (or, under guided decoding, the learner's marker);
    # the scripted ones carry no sampling distribution at all.
    assert records[2].completion_token_ids and len(records[2].logprobs) == len(records[2].completion_token_ids)
    assert all(lp == 0.0 for r in records[:2] for lp in r.logprobs)
    asm = assemble(records)
    [seq] = asm.samples                 # the three calls continue each other token for token
    assert asm.merged_calls == 2
    trained = [t for t, m in zip(seq.token_ids, seq.loss_mask) if m]
    assert trained == records[2].completion_token_ids
    scripted_ids = records[0].completion_token_ids + records[1].completion_token_ids
    start = len(records[0].prompt_token_ids)
    assert seq.token_ids[start:start + len(records[0].completion_token_ids)] == records[0].completion_token_ids
    assert sum(seq.loss_mask[start:start + len(scripted_ids)]) == 0
