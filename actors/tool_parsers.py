"""Tool-call glue over vLLM's own serving-layer parser (`vllm.parser.ParserManager`).

vLLM's unified `Parser` does three things the policy server needs, exactly as `vllm serve
--enable-auto-tool-choice --tool-call-parser NAME` would: constrain `tool_choice`
"required"/named with structural tags (guided decoding), stream content and tool-call
deltas, and parse a finished output. This module only adapts requests and results.

A model that opens a tool call and never finishes a valid one (clipped at max_tokens, bad
JSON) is an expected failure of the policy, not of the program: `unparsed` tells the policy
server so it is counted in the episode record, and vLLM's traceback for it is dropped.
"""
from __future__ import annotations

import inspect
import json
import logging
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager
from vllm.parser.abstract_parser import Parser, make_tool_call_id  # these paths resolve on vLLM 0.26 and 0.32

SUPPORTED = ("hermes", "qwen3_xml")
CALL_START = "<tool_call>"  # both formats open a call with it
# vLLM's parsers that log a traceback for output they cannot parse
_NOISY_LOGGERS = ("vllm.tool_parsers.hermes_tool_parser",)


class _DropUnparsedTraceback(logging.Filter):
    """Drops vLLM's `logger.exception` for a tool call it could not parse (counted instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and "extracting tool call" in record.getMessage())


def _quiet_parsers() -> None:
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropUnparsedTraceback) for f in logger.filters):
            logger.addFilter(_DropUnparsedTraceback())


class ToolCallFormat:
    """The model's tool-call syntax: one vLLM Parser class, one instance per response choice."""

    def __init__(self, tokenizer, name: str, strict_level: str = "auto") -> None:
        if name not in SUPPORTED:
            raise ValueError(f"model.tool_call_parser={name!r} is not supported; use one of {SUPPORTED}")
        self.name = name
        self.tokenizer = tokenizer
        self.mark_strict = False
        if "tool_strict_level" in inspect.signature(ParserManager.get_parser).parameters:
            self.parser_cls = ParserManager.get_parser(tool_parser_name=name, enable_auto_tools=True,
                                                       tool_strict_level=strict_level, tokenizer=tokenizer)
        else:  # vLLM 0.26: no strictness floor; "parameter" is every tool marked strict (honoured per tool)
            if strict_level == "function":
                raise ValueError("rollout.tool_strict_level=function needs vLLM >= 0.32 (this vLLM has no "
                                 "function-level floor); use 'parameter' or 'auto'")
            self.mark_strict = strict_level == "parameter"
            self.parser_cls = ParserManager.get_parser(tool_parser_name=name, enable_auto_tools=True)
        _quiet_parsers()

    def parser(self, request: ChatCompletionRequest) -> Parser | None:
        """A fresh parser (streaming state is per choice); None when the request has no tools."""
        if not request.tools:
            return None
        return self.parser_cls(self.tokenizer, request.tools)

    def adjust(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        """Attach vLLM's guided decoding for tool_choice 'required'/named (and strict tools)."""
        if self.mark_strict and request.tools:
            request = request.model_copy(update={"tools": [
                t.model_copy(update={"function": t.function.model_copy(update={"strict": True})})
                for t in request.tools]})
        parser = self.parser(request)
        return request if parser is None else parser.adjust_request(request)

    def parse(self, request: ChatCompletionRequest, text: str, token_ids: list[int]) -> tuple[str | None, list[dict]]:
        """Final (content, OpenAI tool_calls) of one finished output."""
        parser = self.parser(request)
        if parser is None:
            return text, []
        _, content, calls = parser.parse(text, request, enable_auto_tools=True, model_output_token_ids=token_ids)
        return content, [openai_tool_call(c.name, c.arguments, c.id) for c in calls or []]


def unparsed(text: str, calls: list[dict]) -> bool:
    """The output opened a tool call but none parsed (clipped or malformed)."""
    return not calls and CALL_START in text


def openai_tool_call(name: str, arguments: str, call_id: str | None = None) -> dict:
    return {"id": call_id or make_tool_call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def template_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool-call arguments as objects, not JSON text.

    vLLM's renderer does the same; templates like Qwen3.5's iterate the arguments mapping.
    """
    out = []
    for msg in request.messages:
        m = dict(msg)
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                tc = dict(tc)
                fn = dict(tc.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        parsed = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        parsed = None
                    if isinstance(parsed, dict):
                        fn["arguments"] = parsed
                tc["function"] = fn
                calls.append(tc)
            m["tool_calls"] = calls
        out.append(m)
    return out


def template_tools(request: ChatCompletionRequest) -> list[dict] | None:
    """Tools exactly as vLLM's renderer hands them to the template (`model_dump()`)."""
    if not request.tools:
        return None
    return [t.model_dump() for t in request.tools]
