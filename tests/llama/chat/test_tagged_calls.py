"""Qwen3-Coder's XML tool calls (llama/chat/tagged_calls.py): values typed by the tool's schema
as llama.cpp's qwen3-coder parser types them, malformed blocks refused, and the forced-call
grammar accepting exactly the calls the reader reads (checked with llguidance itself); and
MiniMax M3's object and array arguments, written as nested tags."""
from __future__ import annotations

import json

import llguidance
import pytest

from llama.chat.tagged_calls import MINIMAX_M3, MINIMAX_NS, QWEN3_CODER, typed_value


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


# MiniMax M3: object and array values as nested tags (its template's to_xml), read as llama.cpp's
# minimax-m3 parser reads them, streamed whole, and written so by the forced-call grammar.

NS = MINIMAX_NS
SHAPES = {"name": "shapes", "parameters": {"type": "object", "properties": {
    "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"},
                                               "label": {"type": "string"}}, "required": ["x", "y"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "rows": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "entries": {"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "integer"}, "entries": {"type": "array", "items": {"type": "boolean"}}}, "required": ["id"]}},
    "limit": {"oneOf": [{"type": "integer"}, {"type": "object", "properties": {"max": {"type": "integer"}},
                                                "required": ["max"]}]},
    "filter": {"anyOf": [{"type": "array", "items": {"type": "string"}},
                         {"type": "object", "properties": {"field": {"type": "string"}}, "required": ["field"]}]},
    "note": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}}]},
}, "required": ["point"]}}
M3_SCHEMAS = {"shapes": SHAPES["parameters"]}


def to_xml(value) -> str:
    """A value as MiniMax M3's template writes it (its to_xml macro)."""
    if isinstance(value, dict):
        return "".join(f"{NS}<{k}>{to_xml(v)}{NS}</{k}>" for k, v in value.items())
    if isinstance(value, list):
        return "".join(f"{NS}<item>{to_xml(v)}{NS}</item>" for v in value)
    return json.dumps(value) if isinstance(value, bool) else str(value)


def m3_call(args: dict, name: str = "shapes") -> str:
    return f'{NS}<invoke name="{name}">' + to_xml(args) + f"{NS}</invoke>"


NESTED = {"point": {"x": 1.5, "y": -2, "label": "a <b>"}, "tags": ["alpha", "beta"], "rows": [[1, 2], [], [3]],
          "entries": [{"id": 1, "entries": [True, False]}, {"id": 2}], "limit": {"max": 10},
          "filter": ["x"], "note": "plain"}


@pytest.mark.parametrize("args", [NESTED, {"point": {"x": 0, "y": 0}, "limit": 5, "filter": {"field": "f"}}])
def test_minimax_m3_reads_nested_arguments(args):
    """Objects, arrays, arrays of arrays and of objects, a member named as its parent, and a
    union's first alternative that reads (llama.cpp's minimax-m3 cases)."""
    assert [(n, json.loads(a)) for n, a in MINIMAX_M3.read(m3_call(args), M3_SCHEMAS)] == [("shapes", args)]
    same_name = {"point": {"x": 1, "y": 2}, "entries": [{"id": 3, "entries": [True]}]}
    assert json.loads(MINIMAX_M3.read(m3_call(same_name), M3_SCHEMAS)[0][1]) == same_name


def test_minimax_m3_reads_the_text_of_what_is_not_nested_tags():
    """A union with a string is text, nested tags and all (as llama.cpp reads it); a value that
    shows it is not written as its schema's tags before any of it reads (required members out of
    order, a union's leaf not of its type, JSON) is read as a flat value is: JSON of its type,
    else the text up to its closing tag."""
    def read(args_xml: str) -> dict:
        return json.loads(MINIMAX_M3.read(f'{NS}<invoke name="shapes">{args_xml}{NS}</invoke>', M3_SCHEMAS)[0][1])

    assert read(to_xml({"note": {"text": "hi"}})) == {"note": f"{NS}<text>hi{NS}</text>"}
    assert read(to_xml({"point": {"y": 2, "x": 1}})) == {"point": to_xml({"y": 2, "x": 1})}
    assert read(to_xml({"limit": {"max": "many"}})) == {"limit": f"{NS}<max>many{NS}</max>"}
    assert read(f'{NS}<point>{{"x": 1, "y": 2}}{NS}</point>{NS}<tags>oops{NS}</tags>') == {
        "point": {"x": 1, "y": 2}, "tags": "oops"}
    # one that began as its tags and then is not (streamed so far, then malformed): not a call
    assert MINIMAX_M3.read(m3_call({"point": {"x": "one", "y": 2}}), M3_SCHEMAS) is None
    assert MINIMAX_M3.read(m3_call({"point": {"x": 1, "y": 2, "z": 3}}), M3_SCHEMAS) is None
    # a value that no closing tag of it ends (the call cut off inside it): not a call
    cut = f"{NS}<entries>{NS}<item>{NS}<id>1{NS}</id>{NS}<entries>{NS}<item>true{NS}</item>{NS}</entries>"
    assert MINIMAX_M3.read(f'{NS}<invoke name="shapes">{cut}{NS}</invoke>', M3_SCHEMAS) is None


def test_the_minimax_m3_grammar_writes_nested_arguments():
    """The forced call writes objects and arrays as the template does (as llama.cpp's grammar
    has it): the required members in order, leaves of their types, and what it takes reads back."""
    from llama.chat.tool_calls import tool_call_grammar
    grammar = tool_call_grammar([{"type": "function", "function": SHAPES}], "required", "minimax_m3")

    def block(args_xml: str) -> str:
        return f'{NS}<tool_call>\n{NS}<invoke name="shapes">{args_xml}{NS}</invoke>\n{NS}</tool_call>'

    for args in (NESTED, {"point": {"x": 0, "y": 0}, "limit": 5, "filter": {"field": "f"}, "rows": []}):
        text = block(to_xml(args))
        assert _accepts(grammar, text), text
        assert json.loads(MINIMAX_M3.read(text[len(f"{NS}<tool_call>"):-len(f"{NS}</tool_call>")], M3_SCHEMAS)[0][1]) \
            == args
    assert _accepts(grammar, block(to_xml({"point": {"x": 1, "y": 2}, "note": {"text": "hi"}})))   # text
    for bad in ({"point": {"y": 2, "x": 1}}, {"point": {"x": 1}}, {"point": {"x": "one", "y": 2}},
                {"point": {"x": 1, "y": 2}, "limit": {"max": "many"}}, {"point": {"x": 1, "y": 2, "z": 3}},
                {"point": {"x": 1, "y": 2}, "rows": [["a"]]}):
        assert not _accepts(grammar, block(to_xml(bad))), bad
    assert not _accepts(grammar, block(f'{NS}<point>{{"x": 1, "y": 2}}{NS}</point>'))
