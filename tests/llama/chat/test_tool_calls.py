"""Tool calls: format detection on llama.cpp's real templates, parsing, streaming (checked against the parse
over random chunkings), and the call-forcing grammars run through llguidance with a byte tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from llama.chat.reply import ReplyReader, parse_reply
from llama.chat.tool_calls import (FORMATS, ToolCallStream, assemble_deltas, detect_tool_format,
                                   generic_tools_instruction, parse_tool_calls, tool_call_grammar, tool_call_id)

# llama.cpp's models/templates, copied beside the chat-template tests
TEMPLATES = Path(__file__).resolve().parent / "templates"


# ---------------------------------------------------------------------------------------------- detection

@pytest.mark.parametrize("name, fmt", [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
    ("Qwen-Qwen3-0.6B", "hermes"),
    ("Qwen-QwQ-32B", "hermes"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
    ("google-gemma-2-2b-it", "generic"),
    ("microsoft-Phi-3.5-mini-instruct", "generic"),
    # llama.cpp's copy of SmolLM3's template is Unsloth's, which drops the tools section.
    ("HuggingFaceTB-SmolLM3-3B", "generic"),
    ("Qwen3-Coder", "qwen3_coder"),
    ("Qwen3.5-4B", "qwen3_coder"),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral_args"),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral_args"),
    ("meetkai-functionary-medium-v3.1", "functionary_v3_1"),
    ("meetkai-functionary-medium-v3.2", "functionary_v3_2"),
    ("ByteDance-Seed-OSS", "seed_oss"),
    ("MiniMax-M2", "minimax_m2"),
    ("MiniMax-M3", "minimax_m3"),
    ("deepseek-ai-DeepSeek-V3.2", "dsml"),
    ("deepseek-ai-DeepSeek-V4", "dsml"),
    ("GLM-4.6", "glm"),
    ("GLM-4.7-Flash", "glm"),
    ("inclusionai-ling-3.0-flash", "glm"),
    ("Kimi-K2-Thinking", "kimi_k2"),
    ("LFM2-8B-A1B", "lfm2"),
    ("google-gemma-4-31B-it", "gemma4"),
    ("NVIDIA-Nemotron-Nano-v2", "nemotron_v2"),
    ("unsloth-Apriel-1.5", "apriel"),
    ("Apertus-8B-Instruct", "apertus"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "command_r7b"),
    ("CohereForAI-c4ai-command-r-plus-tool_use", "command_r_plus"),
    ("openbmb-MiniCPM5-1B", "minicpm5"),
    ("muse-glimmer", "muse_glimmer"),
])
def test_detect_on_llama_cpp_templates(name: str, fmt: str) -> None:
    assert detect_tool_format((TEMPLATES / f"{name}.jinja").read_text()) == fmt


def test_detect_by_marker() -> None:
    assert detect_tool_format(None) == "generic"
    assert detect_tool_format("") == "generic"
    assert detect_tool_format("{{- '<tool_call>\\n' }}") == "hermes"
    assert detect_tool_format("<|start_header_id|>ipython<|end_header_id|>") == "llama3"
    assert detect_tool_format('{{- "[TOOL_CALLS][" }}') == "mistral"
    assert detect_tool_format("<tool_call>\n<function=x>") == "functionary_v3_1"
    assert detect_tool_format("<tool_call>\n<function=x>\n<parameter=y>") == "qwen3_coder"


def test_smollm3_upstream_tool_syntax_is_hermes() -> None:
    # SmolLM3's own template (with xml_tools) writes calls as <tool_call>{...}</tool_call>
    assert detect_tool_format('{{- "<tool_call>\\n" + tool_call | tojson + "\\n</tool_call>" }}') == "hermes"


# ---------------------------------------------------------------------------------------------- parsing

def calls_of(text: str, fmt: str) -> tuple[str | None, list[tuple[str, dict]]]:
    content, calls = parse_tool_calls(text, fmt)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("fmt, text, content, calls", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     None, [("get_weather", {"city": "Paris"})]),
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
               '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
     "Let me check.", [("a", {"x": 1}), ("b", {})]),
    ("hermes", '<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>', None, [("a", {"x": 2})]),
    ("hermes", "no calls here", "no calls here", []),
    ("hermes", '<tool_call>\n{"nam": "a", "arguments": {"x": 1}}\n</tool_call>',  # not a call
     '<tool_call>\n{"nam": "a", "arguments": {"x": 1}}\n</tool_call>', []),
    ("hermes", '<tool_call>\n{"name": "a', '<tool_call>\n{"name": "a', []),  # cut off before the name is whole
    # given out once its name was whole, a call stays: the rest of a malformed block is left out
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"x": 1}\n</tool_call>', None, [("a", {"x": 1})]),
    ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>ok', '<tool_call>\n{"arguments": {}}\n</tool_call>ok', []),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", {"city": "Paris"})]),
    ("llama3", '{"type": "function", "name": "f", "parameters": {"q": "}{"}}', None, [("f", {"q": "}{"})]),
    ("llama3", 'Use {braces} and {"a": 1} freely', 'Use {braces} and {"a": 1} freely', []),
    ("llama3", 'Her record: {"name": "Ada", "born": 1815}', 'Her record: {"name": "Ada", "born": 1815}', []),
    ("llama3", '<|python_tag|>{"name": "f", "parameters": {"n": 3}}', None, [("f", {"n": 3})]),
    ("llama3", '<|python_tag|>brave_search.call(query="weather in Paris")', None,
     [("brave_search", {"query": "weather in Paris"})]),
    ("llama3", "<|python_tag|>print(1)", "<|python_tag|>print(1)", []),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"x": "y"}, "id": "abcdefghi"}, '
                '{"name": "b", "arguments": {}}]', None, [("a", {"x": "y"}), ("b", {})]),
    ("mistral", '[TOOL_CALLS] {"name": "a", "arguments": {}}', None, [("a", {})]),
    ("mistral", "[TOOL_CALLS]oops", "[TOOL_CALLS]oops", []),
    ("generic", '{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}',
     None, [("a", {"x": 1}), ("b", {})]),
    ("generic", '{"tool_call": {"name": "a", "arguments": {"x": 1}}}', None, [("a", {"x": 1})]),
    ("generic", '{"response": "Hello \\"there\\"\\n\\u00e9 \\ud83d\\ude00"}', 'Hello "there"\né 😀', []),
    ("generic", "Plain text, no JSON.", "Plain text, no JSON.", []),
    ("generic", '{"something": "else"}', '{"something": "else"}', []),
    # Functionary v3.2: each message opens with >>> and its recipient (the prompt writes the first >>>)
    ("functionary_v3_2", '>>>get_time\n{"city": "Oslo"}>>>get_weather\n{"city": "Rome"}', None,
     [("get_time", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})]),
    ("functionary_v3_2", 'Let me look.>>>get_time\n{}', "Let me look.", [("get_time", {})]),
    ("functionary_v3_2", ">>>python\nprint(1)", ">>>python\nprint(1)", []),   # not JSON: not a call
    # Command R+: Action: and a fenced JSON list; the fence may be missing, and ``` may be in an argument
    ("command_r_plus", 'Action:\n```json\n[{"tool_name": "a", "parameters": {"q": "```"}}, '
                       '{"tool_name": "b", "parameters": {}}]\n```', None, [("a", {"q": "```"}), ("b", {})]),
    ("command_r_plus", 'Action:\n```json\n[{"tool_name": "a", "parameters": {}}]', None, [("a", {})]),
    ("command_r_plus", "Action: none needed", "Action: none needed", []),
])
def test_parse(fmt: str, text: str, content: str | None, calls: list) -> None:
    assert calls_of(text, fmt) == (content, calls)


def test_parse_openai_shape_and_ids() -> None:
    text = '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call><tool_call>{"name": "b"}</tool_call>'
    _, calls = parse_tool_calls(text, "hermes", seed="chatcmpl-1")
    assert calls == [
        {"id": tool_call_id("chatcmpl-1", 0), "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
        {"id": tool_call_id("chatcmpl-1", 1), "type": "function", "function": {"name": "b", "arguments": "{}"}},
    ]
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    assert parse_tool_calls(text, "hermes", seed="chatcmpl-1") == parse_tool_calls(text, "hermes", seed="chatcmpl-1")
    assert parse_tool_calls(text, "hermes", seed="chatcmpl-2")[1][0]["id"] != calls[0]["id"]
    mistral_id = parse_tool_calls('[TOOL_CALLS][{"name": "a", "arguments": {}}]', "mistral")[1][0]["id"]
    assert len(mistral_id) == 9 and mistral_id.isalnum()


def test_parse_deep_nesting_is_content() -> None:
    for fmt, text in [("hermes", "<tool_call>" + "[" * 100_000 + "</tool_call>"),
                      ("mistral", "[TOOL_CALLS]" + "[" * 100_000 + "]" * 100_000),
                      ("llama3", '<|python_tag|>f.call(x=' + "(" * 100_000 + ")")]:
        assert parse_tool_calls(text, fmt) == (text, [])


def test_unknown_format() -> None:
    with pytest.raises(ValueError):
        parse_tool_calls("x", "nope")


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), text=st.text())
def test_parse_never_raises(fmt: str, text: str) -> None:
    content, calls = parse_tool_calls(text, fmt)
    assert content is None or content.strip() == content


# ---------------------------------------------------------------------------------------------- streaming

CORPUS: list[tuple[str, str]] = [
    ("hermes", 'Sure!\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'),
    ("hermes", "a <tool b <tool_cal c </tool_call> <tool_call>{bad}</tool_call> tail <"),
    ("hermes", '<tool_call>\n{"name": "x", "arguments": {"s": "</tool_call"}}'),
    ("hermes", "  just some text with spaces   \n "),
    ("llama3", 'Calling now {"name": "f", "parameters": {"deep": {"a": [1, 2, {"b": "}"}]}}} and {not json}'),
    ("llama3", '{  "type" : "function", "name": "f", "parameters": {}}{"name": "g", "parameters": {"q": "é"}}'),
    ("llama3", '<|python_tag|>wolfram_alpha.call(query="2+2")'),
    ("llama3", '{"name": "f", "parameters": {"x": 1}'),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"k": "[x]"}, "id": "123456789"}]'),
    ("mistral", "Hello [TOOL_ and [TOOL_CALLS] [1, 2]"),
    ("generic", '{"response": "Line one\\nLine \\"two\\" \\ud83d\\ude00 \\u00e9\\\\ end"}'),
    ("generic", '  {"tool_calls": [{"name": "a", "arguments": {"x": [1, {"y": 2}]}}]}'),
    ("generic", '{"response": "cut off \\ud83d'),
    ("generic", "No JSON at all {\"response\": \"x\"}"),
]

FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool", "[TOOL_CALLS]", "<|python_tag|>", "{", "}", "[", "]", '"',
             "\\", '"name": "f"', '"parameters": {}', '"arguments": {"a": 1}', ", ", "\n", " ", "text",
             '{"response": "', '{"tool_calls": [', "\\u00e9", "\\ud83d\\ude00", "é",
             # the other families' markers, so that their stream readers meet broken text too
             "<function=f>", "</function>", "<parameter=a>", "</parameter>", '<invoke name="f">', "</invoke>",
             "<arg_key>a</arg_key>", "<arg_value>", "</arg_value>", "<|tool_call_start|>", "<|tool_call_end|>",
             "f(", "a=1", "b='x'", ")", "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>",
             "<|tool_calls_section_begin|>", "[TOOL_CALLS]f[ARGS]", '"id": "123456789"', "12", "true",
             '"arguments": "{}"', '{"name": "g", ', "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "```json\n",
             ">>>f\n", ">>>all\n", "Action:\n```json\n", "```", '"tool_name": "f"']


def stream(text: str, fmt: str, cuts: list[int]) -> list[dict]:
    s = ToolCallStream(fmt, seed=7)
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    deltas = [d for a, b in zip(bounds, bounds[1:]) for d in s.feed(text[a:b])]
    return deltas + s.finish()


def check_stream_matches_parse(fmt: str, text: str, cuts: list[int]) -> None:
    deltas = stream(text, fmt, cuts)
    assert assemble_deltas(deltas) == parse_tool_calls(text, fmt, seed=7)
    for d in deltas:  # every fragment is either content or one tool-call piece
        assert set(d) in ({"content"}, {"tool_calls"})
        assert d.get("content", "x") != ""


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CORPUS), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_stream_matches_parse_on_corpus(case: tuple[str, str], cuts: list[int]) -> None:
    check_stream_matches_parse(*case, cuts)


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), pieces=st.lists(st.sampled_from(FRAGMENTS), max_size=25),
       cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=20))
def test_stream_matches_parse_on_marker_soup(fmt: str, pieces: list[str], cuts: list[int]) -> None:
    check_stream_matches_parse(fmt, "".join(pieces), cuts)


def test_stream_char_by_char_corpus() -> None:
    for fmt, text in CORPUS:
        check_stream_matches_parse(fmt, text, list(range(len(text))))


def test_stream_delta_shapes() -> None:
    """llama-server's: the call's first delta has its index, id, type, name and the arguments so
    far; the later ones the index and what the arguments grew by."""
    s = ToolCallStream("hermes", seed="c")
    text = 'Hi <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    out = [(i, s.feed(ch)) for i, ch in enumerate(text)]
    assert [d for _, ds in out[:2] for d in ds] == [{"content": "H"}, {"content": "i"}]
    named = text.index('"f"') + 2   # the name's closing quote
    assert all(not ds for i, ds in out[2:named])   # held until the name is whole
    assert out[named][1] == [{"tool_calls": [{"index": 0, "id": tool_call_id("c", 0), "type": "function",
                                              "function": {"name": "f", "arguments": ""}}]}]
    pieces = [tc["function"]["arguments"] for _, ds in out[named + 1:] for d in ds for tc in d["tool_calls"]]
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for _, ds in out[named + 1:] for d in ds)
    assert pieces == ["{", '"', "x", '"', ": ", "1}"]   # the "}" shows the 1 whole and ends the arguments
    assert s.finish() == []


def test_stream_holds_partial_marker_until_it_cannot_be_one() -> None:
    s = ToolCallStream("hermes")
    assert s.feed("a <tool") == [{"content": "a"}]
    assert s.feed("_c") == []
    assert s.feed("x") == [{"content": " <tool_cx"}]
    assert s.finish() == []


def test_stream_generic_response_streams_as_it_decodes() -> None:
    s = ToolCallStream("generic")
    assert s.feed('{"response": "Hel') == [{"content": "Hel"}]
    assert s.feed('lo \\') == [{"content": "lo"}]  # the space waits for more text, the escape for its letter
    assert s.feed('n!"}') == [{"content": " \n!"}]
    assert s.finish() == []


# ---------------------------------------------------------------------------------------------- grammars

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                      "parameters": {"type": "object", "properties": {}}}},
]
SPECIALS = {"<tool_call>": 257, "</tool_call>": 258, "[TOOL_CALLS]": 259}


class _ByteTokenizer:
    """Every byte is a token; then an end-of-text token and a few special marker tokens."""

    def __init__(self) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"] + [m.encode() for m in SPECIALS]
        self.eos_token_id = 256
        self.bos_token_id = None
        self.special_token_ids = [256, *SPECIALS.values()]

    def __call__(self, s: bytes | str) -> list[int]:
        return list(s if isinstance(s, bytes) else s.encode())


@pytest.fixture(scope="module")
def tokenizer():
    llg = pytest.importorskip("llguidance")
    return llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()))


def accepts(tokenizer, grammar: str, text: str, specials: dict[str, int] | None = None) -> bool:
    """Feed ``text`` (with the ``specials`` markers as their tokens) and ask whether the grammar is done."""
    tokens: list[int] = []
    rest = text
    while rest:
        marker = next((m for m in (specials or {}) if rest.startswith(m)), None)
        if marker:
            tokens.append(specials[marker])
            rest = rest[len(marker):]
        else:
            tokens.extend(rest[0].encode())
            rest = rest[1:]
    import llguidance

    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(tokens) and m.is_accepting()


def _text(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


MM = "]<]minimax[>["


def render(fmt: str, name: str, args: dict) -> str:
    """A call written as the format's template writes it (by hand, independently of the readers)."""
    if fmt == "qwen3_coder":
        params = "".join(f"<parameter={k}>\n{_text(v)}\n</parameter>\n" for k, v in args.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    if fmt == "seed_oss":
        params = "".join(f"<parameter={k}>{_text(v)}</parameter>\n" for k, v in args.items())
        return f"<seed:tool_call>\n<function={name}>\n{params}</function>\n</seed:tool_call>"
    tagged = {
        "minimax_m2": lambda: f'<minimax:tool_call>\n<invoke name="{name}">\n' + "".join(
            f'<parameter name="{k}">{_text(v)}</parameter>\n' for k, v in args.items())
            + "</invoke>\n</minimax:tool_call>",
        "minimax_m3": lambda: f'{MM}<tool_call>\n{MM}<invoke name="{name}">' + "".join(
            f"{MM}<{k}>{_text(v)}{MM}</{k}>" for k, v in args.items()) + f"{MM}</invoke>\n{MM}</tool_call>",
        "dsml": lambda: f'<｜DSML｜tool_calls>\n<｜DSML｜invoke name="{name}">\n' + "".join(
            f'<｜DSML｜parameter name="{k}" string="{str(isinstance(v, str)).lower()}">{_text(v)}'
            "</｜DSML｜parameter>\n" for k, v in args.items()) + "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "glm": lambda: f"<tool_call>{name}\n" + "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{_text(v)}</arg_value>\n" for k, v in args.items())
            + "</tool_call>",
        "kimi_k3": lambda: f'<|open|>tools<|sep|><|open|>call tool="{name}" index="1"<|sep|>' + "".join(
            f'<|open|>argument key="{k}" type="{"string" if isinstance(v, str) else "number"}"<|sep|>{_text(v)}'
            "<|close|>argument<|sep|>" for k, v in args.items()) + "<|close|>call<|sep|><|close|>tools<|sep|>",
        "minicpm5": lambda: f'<function name="{name}">' + "".join(
            f'<param name="{k}">{_text(v)}</param>' for k, v in args.items()) + "</function>",
        "mistral_args": lambda: f"[TOOL_CALLS]{name}[ARGS]{json.dumps(args)}",
        "functionary_v3_1": lambda: f"<function={name}>{json.dumps(args)}</function>",
        "kimi_k2": lambda: (f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
                            f"<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"
                            "<|tool_calls_section_end|>"),
        "gemma4": lambda: "<|tool_call>call:" + name + "{" + ",".join(
            f'{k}:<|"|>{v}<|"|>' if isinstance(v, str) else f"{k}:{json.dumps(v)}" for k, v in args.items())
            + "}<tool_call|>",
        "harmony": lambda: (f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
                            f"{json.dumps(args)}<|call|>"),
        "muse_glimmer": lambda: (f' to={name}<|message|><atem:function_calls>\n<atem:invoke name="{name}">\n'
                                 + "".join(f'<atem:parameter name="{k}">{_text(v)}</atem:parameter>\n'
                                           for k, v in args.items())
                                 + "</atem:invoke>\n</atem:function_calls>"),
        "deepseek": lambda: (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json.dumps(args)}"
                             "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        "gigachat3": lambda: ("<|message_sep|>\n\nfunction call<|role_sep|>\n"
                              + json.dumps({"name": name, "arguments": args})),
        "gigachat3_1": lambda: "<|function_call|>" + json.dumps({"name": name, "arguments": args}),
        "firefunction_v2": lambda: " functools" + json.dumps([{"name": name, "arguments": args}]),
        "apertus": lambda: f"<|tools_prefix|>[{json.dumps({name: args})}]<|tools_suffix|>",
        "command_r7b": lambda: f'<|START_ACTION|>[{json.dumps({"tool_name": name, "parameters": args})}]<|END_ACTION|>',
        "command_r_plus": lambda: f'Action:\n```json\n[{json.dumps({"tool_name": name, "parameters": args})}]\n```',
        "functionary_v3_2": lambda: f">>>{name}\n{json.dumps(args)}",
    }
    if fmt in tagged:
        return tagged[fmt]()
    call = json.dumps({"name": name, FORMATS[fmt].arg_keys[0]: args})
    return {"hermes": f"<tool_call>\n{call}\n</tool_call>", "llama3": call, "mistral": f"[TOOL_CALLS][{call}]",
            "generic": json.dumps({"tool_calls": [json.loads(call)]}),
            "lfm2": f"<|tool_call_start|>[{call}]<|tool_call_end|>",
            "nemotron_v2": f"<TOOLCALL>[{call}]</TOOLCALL>", "apriel": f"<tool_calls>[{call}]</tool_calls>"}[fmt]


def generated(fmt: str, text: str) -> str:
    """What the model writes of a reply: the opening of its first message is the prompt's
    (Functionary v3.2's `>>>`), so a forced call's grammar starts after it."""
    return text.removeprefix(FORMATS[fmt].reply_opening)


def parse(text: str, fmt: str, tools=None):
    """(content, calls) as a chat completion reads them (harmony and muse_glimmer have their own readers)."""
    if fmt in ("harmony", "muse_glimmer"):
        message = parse_reply(text, ReplyReader(tool_format=fmt, tools=tools, family=fmt))
        return message["content"] or None, message.get("tool_calls", [])
    return parse_tool_calls(text, fmt, tools=tools)


TEXT_VALUES = {"qwen3_coder", "seed_oss", "minimax_m2", "minimax_m3", "glm", "minicpm5", "kimi_k3",
               "muse_glimmer"}  # a string is bare text
FORCED = sorted(f for f in FORMATS if FORMATS[f].grammar.json is not None)


def test_functionary_v3_2_reads_its_messages_on_from_the_prompts_opening() -> None:
    """Functionary v3.2's prompt ends with the first message's `>>>`: the reply names its recipient,
    `all` (the answer, whose recipient line is not content) or a function (a call); a continued answer
    is written after `>>>all\n`, as llama.cpp writes it."""
    from llama.api.chat_completion import ChatSetup, reply_reader
    from llama.api.chat_prompt import chat_prompt
    from llama.chat import ChatTemplate

    setup = ChatSetup.for_template(ChatTemplate((TEMPLATES / "meetkai-functionary-medium-v3.2.jinja").read_text(),
                                                lenient=True))
    user = [{"role": "user", "content": "Hi"}]
    prompt = chat_prompt(setup, user, tools=TOOLS)
    assert prompt.text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n>>>")
    message = parse_reply('all\nLet me look.>>>get_time\n{"city": "Oslo"}', reply_reader(setup, prompt, TOOLS, "auto",
                                                                                         "auto"))
    assert message["content"] == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_time", {"city": "Oslo"})]
    plain = chat_prompt(setup, user)
    assert parse_reply("all\nHello!", reply_reader(setup, plain, None, "none", "auto"))["content"] == "Hello!"
    continued = chat_prompt(setup, user + [{"role": "assistant", "content": "Hello, "}], add_generation_prompt=False)
    assert continued.text.endswith(">>>all\nHello, ")
    assert parse_reply("world!", reply_reader(setup, continued, None, "none", "auto"))["content"] == "Hello, world!"


def answered(fmt: str, call: str) -> str:
    """"Sure." and then `call`, as the family writes an answer before a call (generic: no answer)."""
    if fmt == "generic":
        return call
    if fmt == "muse_glimmer":   # the answer's own message, ended by <|eom|>, then the call's
        return " to=user<|message|>Sure.<|eom|><|start|>assistant" + call
    return "Sure. " + call


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_reads_its_own_calls(fmt: str) -> None:
    for name, args in (("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})):
        content, calls = parse(answered(fmt, render(fmt, name, args)), fmt, tools=TOOLS)
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [(name, args)]
        assert content in (None, "Sure.")




@pytest.mark.parametrize("fmt", FORCED)
def test_grammar_forces_a_valid_call(tokenizer, fmt: str) -> None:
    import llguidance

    grammar = tool_call_grammar(TOOLS, "required", fmt)
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""
    good = [render(fmt, "get_weather", {"city": "Paris"}), render(fmt, "get_weather", {"city": "Oslo", "days": 3}),
            render(fmt, "get_time", {})]
    bad = [render(fmt, "get_wether", {"city": "Paris"}),       # no such tool
           render(fmt, "get_weather", {"days": 2}),           # missing required argument
           render(fmt, "get_weather", {"city": "x", "days": 0}),  # below the minimum
           render(fmt, "get_time", {}) + " and more",         # anything after the call
           "I will not call a tool."]
    if fmt not in TEXT_VALUES:   # where a string parameter is bare text, "5" is a city
        bad.append(render(fmt, "get_weather", {"city": 5}))   # wrong type
    for text in good:
        assert accepts(tokenizer, grammar, generated(fmt, text)), text
        content, calls = parse(text, fmt)  # what the grammar lets through parses back as the call
        assert content is None and len(calls) == 1
    for text in bad:
        assert not accepts(tokenizer, grammar, generated(fmt, text)), text


@pytest.mark.parametrize("fmt", FORCED)
def test_grammar_for_a_named_tool(tokenizer, fmt: str) -> None:
    grammar = tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, fmt)
    assert accepts(tokenizer, grammar, generated(fmt, render(fmt, "get_time", {})))
    assert not accepts(tokenizer, grammar, generated(fmt, render(fmt, "get_weather", {"city": "Paris"})))


def test_grammar_mistral_allows_its_call_id(tokenizer) -> None:
    grammar = tool_call_grammar(TOOLS, "required", "mistral")
    assert accepts(tokenizer, grammar, '[TOOL_CALLS][{"name": "get_time", "arguments": {}, "id": "a1B2c3D4e"}]')
    assert not accepts(tokenizer, grammar, '[TOOL_CALLS][{"name": "get_time", "arguments": {}, "id": "short"}]')


@pytest.mark.parametrize("fmt", ["hermes", "mistral"])
def test_grammar_special_token_markers(tokenizer, fmt: str) -> None:
    grammar = tool_call_grammar(TOOLS, "required", fmt, special_tokens=SPECIALS)
    text = render(fmt, "get_time", {})
    assert accepts(tokenizer, grammar, text, SPECIALS)
    assert not accepts(tokenizer, grammar, text)  # spelled out byte by byte, the marker is not the token


def test_grammar_generic_auto_allows_a_response(tokenizer) -> None:
    grammar = tool_call_grammar(TOOLS, "auto", "generic")
    assert accepts(tokenizer, grammar, '{"response": "It is sunny."}')
    assert accepts(tokenizer, grammar, render("generic", "get_time", {}))
    assert not accepts(tokenizer, grammar, "It is sunny.")
    assert not accepts(tokenizer, tool_call_grammar(TOOLS, "required", "generic"), '{"response": "x"}')


def test_grammar_refuses_what_it_cannot_force() -> None:
    with pytest.raises(ValueError):
        tool_call_grammar(TOOLS, "auto", "hermes")
    with pytest.raises(ValueError):
        tool_call_grammar(TOOLS, "none", "generic")
    with pytest.raises(ValueError):
        tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "missing"}}, "hermes")
    with pytest.raises(ValueError):
        tool_call_grammar([], "required", "hermes")


def test_generic_tools_instruction() -> None:
    text = generic_tools_instruction(TOOLS)
    assert "get_weather" in text and "Weather in a city" in text and '"required": ["city"]' in text
    assert '{"tool_calls": [' in text and '{"response": ' in text


def test_gemma4_grammar_takes_any_gemma_value_where_the_schema_is_not_a_scalar(tokenizer) -> None:  # noqa: F811
    """An object or array parameter is any value in Gemma's syntax (llama.cpp's gemma4-value); a
    string enum is one of its values between <|"|> marks; the call parses back."""
    tools = [{"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "properties": {
        "mode": {"enum": ["fast", "slow"]}, "opts": {"type": "object"}, "steps": {"type": "array"}},
        "required": ["mode"]}}}]
    grammar = tool_call_grammar(tools, "required", "gemma4")
    good = '<|tool_call>call:plan{mode:<|"|>fast<|"|>,opts:{a:<|"|>x, y<|"|>,b:[1,true,null]},steps:[]}<tool_call|>'
    assert accepts(tokenizer, grammar, good)
    assert [json.loads(c["function"]["arguments"]) for c in parse_tool_calls(good, "gemma4", tools=tools)[1]] == [
        {"mode": "fast", "opts": {"a": "x, y", "b": [1, True, None]}, "steps": []}]
    for bad in ('<|tool_call>call:plan{mode:<|"|>medium<|"|>}<tool_call|>',
                '<|tool_call>call:plan{opts:{}}<tool_call|>',
                '<|tool_call>call:plan{mode:"fast"}<tool_call|>'):
        assert not accepts(tokenizer, grammar, bad), bad
