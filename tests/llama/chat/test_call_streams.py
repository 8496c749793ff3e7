"""Calls streamed as llama-server streams them (call_streams.py, json_stream.py, tagged_stream.py,
pythonic_stream.py): a call's first delta once its name is whole, then its arguments as they
grow, adding up to the arguments the parse of the whole reply gives; and `parallel_tool_calls`,
in the readers (one call) and in the forced-call grammars (one, or one or more)."""
from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings, strategies as st

from llama.chat.json_stream import JsonReader
from llama.chat.reply import ReplyReader, parse_reply
from llama.chat.tool_calls import FORMATS, ToolCallStream, assemble_deltas, parse_tool_calls, tool_call_grammar
from tests.llama.chat.test_tool_calls import MM, TOOLS, accepts, generated, render, tokenizer  # noqa: F401 (fixture)

LONG = {"city": "Paris, " + "the city of light; " * 20 + 'with "quotes", \\ and é', "days": 3}
STREAMED = sorted(f for f in FORMATS if any(b.stream for b in FORMATS[f].blocks))


class _Root:
    depth = 0

    def __init__(self) -> None:
        self.out: list[str] = []

    def start(self, path, first):
        return self.out if path == () else None

    def end(self, path) -> None:
        pass


def _echo(text: str, cuts: list[int]) -> tuple[list[str], JsonReader]:
    """What a JsonReader has written after each cut (and at the end)."""
    root = _Root()
    reader = JsonReader(root)
    seen = []
    for cut in sorted(c % (len(text) + 1) for c in cuts) + [len(text)]:
        reader.advance(text, 0, cut, False)
        seen.append("".join(root.out))
    reader.advance(text, 0, len(text), True)
    seen.append("".join(root.out))
    return seen, reader


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(value=JSON, indent=st.sampled_from([None, 0, 2]), ascii_=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=500), max_size=20))
def test_the_json_reader_writes_what_json_dumps_writes(value, indent, ascii_, cuts) -> None:
    """Whatever the layout and escapes, and wherever the text is cut, what the reader has written
    only grows, and ends as json.dumps(json.loads(text), ensure_ascii=False)."""
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_)
    seen, reader = _echo(text, cuts)
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))
    assert reader.done and not reader.error and seen[-1] == json.dumps(json.loads(text), ensure_ascii=False)


@pytest.mark.parametrize("text", ['{"a": 1,}', '{"a" 1}', "[1 2]", '{"a": "\\x"}', '{"a": 01}', '{"a": tru}',
                                  '{"a": "\x01"}', '{"a": "\\ud800\\uzzzz"}', "[1,]", '{"a":}', "}"])
def test_the_json_reader_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    _, reader = _echo(text, list(range(len(text))))
    assert reader.error or not reader.done


def _arguments_deltas(fmt: str, text: str, tools=TOOLS) -> tuple[list[dict], list[dict]]:
    """(the tool-call deltas of `text` streamed a character at a time, the parse's calls)."""
    stream = ToolCallStream(fmt, 3, tools)
    deltas = [d for ch in text for d in stream.feed(ch)] + stream.finish()
    return [tc for d in deltas for tc in d.get("tool_calls", ())], parse_tool_calls(text, fmt, 3, tools)[1]


@pytest.mark.parametrize("fmt", STREAMED)
def test_every_family_streams_a_long_argument(fmt: str) -> None:
    text = "Sure. " + render(fmt, "get_weather", LONG) if fmt != "generic" else render(fmt, "get_weather", LONG)
    pieces, calls = _arguments_deltas(fmt, text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("get_weather", LONG)]
    first = pieces[0]
    assert set(first) == {"index", "id", "type", "function"} and first["id"] == calls[0]["id"]
    assert first["function"]["name"] == "get_weather" and set(first["function"]) == {"name", "arguments"}
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in pieces[1:])
    assert "".join(p["function"]["arguments"] for p in pieces) == calls[0]["function"]["arguments"]
    if fmt not in ("mistral", "command_r7b"):   # these wait for the id the model may write after the arguments
        assert len(pieces) > 20


def test_a_call_waits_for_its_whole_name_and_the_id_it_writes() -> None:
    stream = ToolCallStream("hermes")
    assert stream.feed('<tool_call>{"name": "get_wea') == []
    assert stream.feed('ther", "arguments": {"ci')[0]["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"ci'}
    # Command R7B writes the id before the name: the call starts with it
    text = '<|START_ACTION|>[{"tool_call_id": "7", "tool_name": "get_time", "parameters": {"city": "Oslo"'
    stream = ToolCallStream("command_r7b")
    first = [tc for d in stream.feed(text) for tc in d["tool_calls"]][0]
    assert first["id"] == "7" and first["function"] == {"name": "get_time", "arguments": '{"city": "Oslo"'}
    # Mistral Nemo's id follows the arguments: the call waits for it
    stream = ToolCallStream("mistral")
    assert stream.feed('[TOOL_CALLS][{"name": "get_time", "arguments": {"city": "Oslo"}') == []
    first = stream.feed(', "id": "a1B2c3D4e"}]')[0]["tool_calls"][0]
    assert first["id"] == "a1B2c3D4e" and first["function"]["arguments"] == '{"city": "Oslo"}'


@pytest.mark.parametrize("fmt, text, name, arguments", [
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"city": "Par', "get_time", '{"city": "Par'),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"days": 12', "get_weather", '{"days": '),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "get_weather", '{"city": "Par'),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=days>\n3", "get_weather", '{"days": '),
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa", "get_weather", '{"city": "Pa'),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Os', "get_weather",
     '{"city": "Os'),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="city">Os', "get_time",
     '{"city": '),   # no schema says the value is a string: it waits to be whole
    ("dsml", '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="days" string="false">3',
     "get_weather", '{"days": '),
    ("lfm2", "<|tool_call_start|>[get_weather(city='Paris', days=", "get_weather", '{"city": "Paris", "days": '),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>"
                '{"city": "Oslo', "get_time", '{"city": "Oslo'),
    ("deepseek", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"city"', "get_time", '{"city"'),
    ("mistral_args", '[TOOL_CALLS]get_time[ARGS]{"city": "Lima"', "get_time", '{"city": "Lima"'),
    ("functionary_v3_1", '<function=get_time>{"city": ', "get_time", '{"city": '),
    ("functionary_v3_2", '>>>get_time\n{"city": "Li', "get_time", '{"city": "Li'),
    ("command_r_plus", 'Action:\n```json\n[{"tool_name": "get_time", "parameters": {"city": "Li', "get_time",
     '{"city": "Li'),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Par', "get_weather", '{"city": "Par'),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"', "get_weather", '{"city": "Paris'),
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:12', "get_weather", '{"city": "Oslo", "days": '),
])
def test_a_cut_off_call_has_its_name_and_the_arguments_so_far(fmt, text, name, arguments) -> None:
    """What a stream has settled of a reply cut inside a call: the call, with the arguments that
    are certain (a number or a string value that may go on is held; a closing quote too)."""
    stream = ToolCallStream(fmt, tools=TOOLS)
    deltas = stream.feed(text)
    calls = [tc for d in deltas for tc in d.get("tool_calls", ())]
    assert calls[0]["function"]["name"] == name and not any("content" in d for d in deltas)
    assert "".join(c["function"]["arguments"] for c in calls) == arguments


def test_once_given_out_a_call_stays() -> None:
    """The whole reply is read as its stream: a call whose name was whole stays a call (with the
    arguments it got) when the reply is cut off there or its block turns out malformed."""
    content, calls = parse_tool_calls('<tool_call>\n{"name": "a", "argu', "hermes")
    assert content is None and [c["function"] for c in calls] == [{"name": "a", "arguments": ""}]
    content, calls = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"x": [1, 2}}</tool_call> after', "hermes")
    assert calls[0]["function"] == {"name": "a", "arguments": '{"x": [1, 2'} and content == "after"
    # an element that is not a call, before any call was given out, leaves the block as content
    text = '[TOOL_CALLS][1, {"name": "a", "arguments": {}}]'
    assert parse_tool_calls(text, "mistral") == (text, [])


TWO = [("get_weather", {"city": "Paris"}), ("get_time", {})]


def _two_calls(fmt: str) -> str:
    """Two calls, written as the family writes several."""
    (n1, a1), (n2, a2) = TWO
    one, two = render(fmt, n1, a1), render(fmt, n2, a2)
    shape = FORMATS[fmt].grammar
    if shape.repeat == "block" or fmt == "minicpm5":   # Muse Glimmer's next message after <|eom|><|start|>assistant
        return one + ("" if shape.json == "named" else shape.between or "\n" if shape.repeat == "block" else "") + two
    if fmt == "kimi_k2":
        return one.replace("<|tool_calls_section_end|>", "") + two.replace("<|tool_calls_section_begin|>", "")[
            :-len("<|tool_calls_section_end|>")].replace(":0<", ":1<") + "<|tool_calls_section_end|>"
    if fmt == "deepseek":
        return one.replace("<｜tool▁calls▁end｜>", "") + two.replace("<｜tool▁calls▁begin｜>", "")
    if shape.json == "tagged":   # the second invoke inside the first's block
        open_, close = shape.before[0].rstrip("\n"), shape.after[0]
        return one[:-len(close)] + two[len(open_):]
    key, name_key = FORMATS[fmt].arg_keys[0], FORMATS[fmt].name_key
    items = [{n: a} if FORMATS[fmt].name_as_key else {name_key: n, key: a} for n, a in TWO]
    if fmt == "generic":
        return json.dumps({"tool_calls": items})
    array = json.dumps(items)
    return one.replace(json.dumps([items[0]]), array)


FORCED = sorted(f for f in FORMATS if FORMATS[f].grammar.json is not None and f != "harmony")


@pytest.mark.parametrize("fmt", FORCED)
def test_parallel_tool_calls_in_the_forced_grammars(tokenizer, fmt: str) -> None:  # noqa: F811
    """Without parallel_tool_calls a forced grammar takes one call; with it, one or more where the
    family writes several (llama.cpp's `(call)+`), still one where it writes one."""
    single = tool_call_grammar(TOOLS, "required", fmt)
    several = tool_call_grammar(TOOLS, "required", fmt, parallel=True)
    one = generated(fmt, render(fmt, *TWO[0]))
    assert accepts(tokenizer, single, one) and accepts(tokenizer, several, one)
    if FORMATS[fmt].grammar.repeat is None:
        assert several == single
        return
    two = _two_calls(fmt)
    assert not accepts(tokenizer, single, generated(fmt, two)), two
    assert accepts(tokenizer, several, generated(fmt, two)), two
    assert not accepts(tokenizer, several, generated(fmt, two) + " and more")
    calls = _calls(two, fmt)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == TWO
    assert [c["function"]["name"] for c in _calls(two, fmt, parallel=False)] == ["get_weather"]


def _calls(text: str, fmt: str, parallel: bool = True) -> list[dict]:
    """The calls of a reply (Muse Glimmer's replies are messages, read by their own reader)."""
    if fmt == "muse_glimmer":
        reader = ReplyReader(tool_format=fmt, tools=TOOLS, family=fmt, parallel=parallel)
        return parse_reply(text, reader).get("tool_calls", [])
    return parse_tool_calls(text, fmt, tools=TOOLS, parallel=parallel)[1]


def test_a_named_function_with_parallel_calls(tokenizer) -> None:  # noqa: F811
    grammar = tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, "hermes", parallel=True)
    two = render("hermes", "get_time", {}) + "\n" + render("hermes", "get_time", {"city": "Rome"})
    assert accepts(tokenizer, grammar, two)
    assert not accepts(tokenizer, grammar, render("hermes", "get_time", {}) + "\n" + render("hermes", *TWO[0]))


def test_without_parallel_calls_the_reply_ends_where_a_second_call_begins() -> None:
    one = render("hermes", *TWO[0])
    stream = ToolCallStream("hermes", parallel=False)
    deltas = stream.feed(one + "\nChecked.\n")
    assert not stream.done and deltas[-1] == {"content": "Checked."}
    deltas += stream.feed(render("hermes", *TWO[1]) + " more")
    assert stream.done and stream.finish() == []
    calls = [tc for d in deltas for tc in d.get("tool_calls", ())]
    assert {c["index"] for c in calls} == {0} and calls[0]["function"]["name"] == "get_weather"
    # several calls in one block: only the first
    text = _two_calls("mistral")
    assert [c["function"]["name"] for c in parse_tool_calls(text, "mistral", parallel=False)[1]] == ["get_weather"]
    stream = ToolCallStream("mistral", parallel=False)
    stream.feed(text)
    assert stream.done


def test_minimax_m3_keeps_its_closing_tag_apart_from_an_argument_tag() -> None:
    text = render("minimax_m3", "get_weather", {"city": "Paris", "days": 3})
    assert f"{MM}</invoke>" in text
    calls = parse_tool_calls(text, "minimax_m3", tools=TOOLS)[1]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 3}


def _m3_arguments(text: str, tools: list[dict]) -> str:
    """The arguments a MiniMax M3 stream has sent of the reply so far (one call)."""
    deltas = ToolCallStream("minimax_m3", 3, tools).feed(text)
    return "".join(tc["function"]["arguments"] for d in deltas for tc in d.get("tool_calls", ()))


def test_minimax_m3_streams_a_nested_argument_as_it_grows() -> None:
    """An object or array argument written as nested tags streams as llama-server streams it, its
    JSON so far only growing: ``{`` and a key once the member's tag is whole, a string as far as
    it has come, another leaf once its closing tag shows it whole (an inner tag of the same name
    does not end the value); a union that takes no string once an alternative has read. Wherever
    the reply is cut, the deltas add up to the parse of the whole reply."""
    from tests.llama.chat.test_tagged_calls import NESTED, SHAPES, to_xml
    tools = [{"type": "function", "function": SHAPES}]
    args = {**NESTED, "point": {"x": 1.5, "y": -2, "label": 'a long "label" <b>'},
            "entries": [{"id": 1, "entries": [True]}]}
    text = f'Sure.{MM}<tool_call>\n{MM}<invoke name="shapes">{to_xml(args)}{MM}</invoke>\n{MM}</tool_call>'
    pieces, calls = _arguments_deltas("minimax_m3", text, tools)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("shapes", args)]
    whole = calls[0]["function"]["arguments"]
    sent = [whole[:n] for n in itertools.accumulate(len(p["function"]["arguments"]) for p in pieces)]
    assert sent[-1] == whole
    point = whole.index('"point": ') + len('"point": ')
    inside = [s for s in sent if point < len(s) < point + len(json.dumps(args["point"]))]
    assert len(inside) > 10   # the label a character at a time, and each member
    assert _m3_arguments(text[:text.index("long")], tools) == '{"point": {"x": 1.5, "y": -2, "label": "a '
    assert _m3_arguments(text[:text.index("1.5") + 2], tools) == '{"point": {"x": '   # not yet whole
    entries = text.index(f"{MM}<entries>")
    assert _m3_arguments(text[:text.index(f"{MM}</entries>") + len(f"{MM}</entries>")], tools).endswith(
        ', "entries": [{"id": 1, "entries": [true]')   # the item's own entries ended there, not the argument
    assert _m3_arguments(text[:entries + len(f"{MM}<entries>")], tools).endswith(', "entries": ')
    assert _m3_arguments(text[:entries + len(f"{MM}<entries>{MM}<item>")], tools).endswith(', "entries": [')
    assert json.dumps(args["limit"]) in [p["function"]["arguments"] for p in pieces]   # a union: whole
    parsed = parse_tool_calls(text, "minimax_m3", 3, tools)
    so_far = ""
    for cut in range(len(text) + 1):   # what is sent only grows, and the rest adds up to the parse
        stream = ToolCallStream("minimax_m3", 3, tools)
        head = stream.feed(text[:cut])
        now = "".join(tc["function"]["arguments"] for d in head for tc in d.get("tool_calls", ()))
        assert now.startswith(so_far) and whole.startswith(now)
        so_far = now
        assert assemble_deltas(head + stream.feed(text[cut:]) + stream.finish()) == parsed


def test_minimax_m3_reads_a_nested_argument_not_written_as_its_tags() -> None:
    """One that shows it is not written as its schema's tags before any of it was sent is read as
    a flat value (its text, or JSON of its type); one malformed past what was sent ends the call
    there, as llama.cpp's parse fails there."""
    from tests.llama.chat.test_tagged_calls import SHAPES, to_xml
    tools = [{"type": "function", "function": SHAPES}]

    def call(xml: str) -> str:
        return f'{MM}<tool_call>\n{MM}<invoke name="shapes">{xml}{MM}</invoke>\n{MM}</tool_call>'

    flat = call(to_xml({"point": {"y": 2, "x": 1}}) + f'{MM}<tags>{{"a": 1}}{MM}</tags>')
    calls = parse_tool_calls(flat, "minimax_m3", 3, tools)[1]
    assert json.loads(calls[0]["function"]["arguments"]) == {"point": to_xml({"y": 2, "x": 1}), "tags": '{"a": 1}'}
    malformed = call(to_xml({"point": {"x": 1, "y": 2, "z": 3}, "tags": ["a"]}))
    calls = parse_tool_calls(malformed, "minimax_m3", 3, tools)[1]
    assert calls[0]["function"]["arguments"] == '{"point": {"x": 1, "y": 2'
    for cut in range(len(malformed) + 1):
        stream = ToolCallStream("minimax_m3", 3, tools)
        assert assemble_deltas(stream.feed(malformed[:cut]) + stream.feed(malformed[cut:]) + stream.finish())[1] \
            == calls
