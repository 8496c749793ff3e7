"""Qwen3-Coder's XML tool calls (llama/chat/tagged_calls.py): values typed by the tool's schema
as llama.cpp's qwen3-coder parser types them, malformed blocks refused, and the forced-call
grammar accepting exactly the calls the reader reads (checked with llguidance itself)."""
from __future__ import annotations

import json

import llguidance
import pytest

from llama.chat.tagged_calls import QWEN3_CODER, typed_value


def read_xml_calls(payload, schemas):
    return QWEN3_CODER.read(payload, schemas)


def xml_call_grammar(functions):
    return QWEN3_CODER.grammar(functions, "<tool_call>\n", "</tool_call>")

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array"},
    "either": {"type": ["number", "string"]}}, "required": ["city", "days"]}}
PYTHON = {"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                           "required": ["code"]}}
SCHEMAS = {t["name"]: t["parameters"] for t in (WEATHER, PYTHON)}


def block(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"\n<function={name}>\n{body}</function>\n"


@pytest.mark.parametrize("text, schema, expected", [
    ("Paris", {"type": "string"}, "Paris"),
    ("3", {"type": "string"}, "3"),
    ("3", {"type": "integer"}, 3),
    ("3.0", {"type": "integer"}, 3),
    ("[1, 2]", {"type": "array"}, [1, 2]),
    ("not json", {"type": "array"}, "not json"),
    ("2.5", {"type": ["number", "string"]}, 2.5),
    ("two", {"type": ["number", "string"]}, "two"),
    ('"quoted"', {"type": ["number", "string"]}, '"quoted"'),
    ("true", {"type": "boolean"}, True),
    ("true", None, True),
])
def test_values_are_typed_by_the_schema(text, schema, expected):
    assert typed_value(text, schema) == expected


def test_calls_are_read():
    text = block("get_weather", city="New York", days="3", tags='["a"]') + block("python", code="if a < b:\n    pass")
    calls = read_xml_calls(text, SCHEMAS)
    assert [(n, json.loads(a)) for n, a in calls] == [
        ("get_weather", {"city": "New York", "days": 3, "tags": ["a"]}), ("python", {"code": "if a < b:\n    pass"})]
    assert read_xml_calls("\n<function=python>\n</function>\n", SCHEMAS) == [("python", "{}")]


@pytest.mark.parametrize("bad", ["no call here", "<function=x>\n<parameter=a>\n1\n</function>",
                                 "<function=x>\nstray text\n</function>"])
def test_malformed_blocks_are_not_calls(bad):
    assert read_xml_calls(bad, SCHEMAS) is None


def _accepts(grammar: str, text: str) -> bool:
    """Whether llguidance's own matcher takes `text` as a whole match of `grammar`."""
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
    matcher = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", grammar))
    ok = matcher.consume_tokens(list(text.encode()))
    return ok and matcher.is_accepting()


class _ByteTokenizer:
    """One token per byte (and an end-of-sequence token), enough to run a grammar over text."""
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]

    def __call__(self, s, **kwargs):
        return list(s.encode() if isinstance(s, str) else s)


def test_the_grammar_takes_exactly_one_well_typed_call():
    grammar = xml_call_grammar([WEATHER, PYTHON])
    good = "<tool_call>" + block("get_weather", city="Paris, <France>", days="3").lstrip(" ") + "</tool_call>"
    assert _accepts(grammar, good)
    assert read_xml_calls(good[len("<tool_call>"):-len("</tool_call>")], SCHEMAS)
    assert _accepts(grammar, "<tool_call>" + block("python", code="x = 1\nprint(x)") + "</tool_call>")
    assert not _accepts(grammar, "<tool_call>" + block("get_weather", city="Paris") + "</tool_call>")  # days missing
    assert not _accepts(grammar, "<tool_call>" + block("get_weather", city="Paris", days="three") + "</tool_call>")
    assert not _accepts(grammar, "<tool_call>" + block("nope", x="1") + "</tool_call>")


def test_the_format_is_detected_streamed_and_forced():
    """Templates with `<tool_call>`, `<function=` and `<parameter=` use it (llama.cpp's check);
    a streamed reply cut anywhere gives the calls the whole reply gives."""
    from pathlib import Path

    from llama.chat.tool_calls import ToolCallStream, assemble_deltas, detect_tool_format, parse_tool_calls
    from llama.chat.tool_calls import tool_call_grammar
    templates = Path(__file__).parent / "templates"
    for name in ("Qwen3-Coder", "Qwen3.5-4B"):
        assert detect_tool_format((templates / f"{name}.jinja").read_text()) == "qwen3_coder"
    tools = [{"type": "function", "function": f} for f in (WEATHER, PYTHON)]
    reply = "Let me check.\n<tool_call>" + block("get_weather", city="Paris", days="2") + "</tool_call>"
    content, calls = parse_tool_calls(reply, "qwen3_coder", tools=tools)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2})]
    for cut in range(len(reply) + 1):
        stream = ToolCallStream("qwen3_coder", 0, tools)
        assert assemble_deltas(stream.feed(reply[:cut]) + stream.feed(reply[cut:]) + stream.finish()) == (content, calls)
    assert tool_call_grammar(tools, "required", "qwen3_coder") == xml_call_grammar([WEATHER, PYTHON])
    assert "python" not in tool_call_grammar(tools, {"type": "function", "function": {"name": "get_weather"}},
                                             "qwen3_coder")
