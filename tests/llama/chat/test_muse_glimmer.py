"""Muse Glimmer's replies (llama/chat/muse_glimmer.py), read as llama.cpp's parser reads them: a
reply is messages to `self` (reasoning), then the answer or calls (a message to a function, its
ATEM markup), whole and streamed cut anywhere; its continued messages and its forced calls."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from llama.api.chat_completion import ChatSetup, reply_reader
from llama.api.chat_prompt import chat_prompt
from llama.chat import ChatTemplate
from llama.chat.reasoning import Reasoning, thinking_tags
from llama.chat.reply import ReplyReader, assemble_message, parse_reply
from llama.chat.tool_calls import detect_tool_format, tool_call_grammar
from tests.llama.chat import test_tool_calls
from tests.llama.chat.test_tool_calls import TOOLS, accepts, render

tokenizer = test_tool_calls.tokenizer   # the byte tokenizer fixture the grammar tests use

SOURCE = (Path(__file__).resolve().parent / "templates" / "muse-glimmer.jinja").read_text(encoding="utf-8")
TAGS = thinking_tags(SOURCE)
NEXT = "<|eom|><|start|>assistant"   # one message ended, the next one's opening
PARIS = render("muse_glimmer", "get_weather", {"city": "Paris", "days": 3})
OSLO = render("muse_glimmer", "get_weather", {"city": "Oslo"})
TIME = render("muse_glimmer", "get_time", {})


def reader(split: bool = True, calls: bool = True, parallel: bool = True, json_answer: bool = False,
           prefill: str = "") -> ReplyReader:
    return ReplyReader(Reasoning(TAGS) if split else None, "muse_glimmer" if calls else None, TOOLS, seed=1,
                       prefill=prefill, family="muse_glimmer", parallel=parallel, json_fence=json_answer)


def read(text: str, r: ReplyReader) -> tuple[str, str, list]:
    message = parse_reply(text, r)
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    return message.get("content") or "", message.get("reasoning_content", ""), calls


def test_the_template_is_muse_glimmers() -> None:
    assert detect_tool_format(SOURCE) == "muse_glimmer"
    assert (TAGS.start, TAGS.end) == (" to=self<|message|>", "<|eom|><|start|>assistant to=user<|message|>")


CASES = [
    # (reply, reader options) -> (content, reasoning, calls)
    (" to=self<|message|>Hmm.<|eom|><|start|>assistant to=user<|message|>Hi!<|eot|>", {}, ("Hi!", "Hmm.", [])),
    (" to=self<|message|>A<|eom|><|start|>assistant to=self<|message|>B<|eom|><|start|>assistant<|message|>Hi",
     {}, ("Hi", "AB", [])),
    # calls: first, or after an answer that ended with <|eom|>, more after each <|eom|> with parallel calls
    (PARIS, {}, ("", "", [("get_weather", {"city": "Paris", "days": 3})])),
    (" to=user<|message|>Let me see.<|eom|><|start|>assistant" + PARIS + NEXT + OSLO, {},
     ("Let me see.", "", [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo"})])),
    (PARIS + NEXT + OSLO, {"parallel": False}, ("", "", [("get_weather", {"city": "Paris", "days": 3})])),
    # what llama.cpp reads no further than: after <|eot|>, an answer after an answer, a call after <|eot|>
    (" to=user<|message|>Hi<|eot|><|start|>assistant to=user<|message|>more", {}, ("Hi", "", [])),
    (" to=user<|message|>Hi<|eom|><|start|>assistant to=user<|message|>more", {}, ("Hi", "", [])),
    (" to=user<|message|>Hi<|eot|><|start|>assistant" + PARIS, {}, ("Hi", "", [])),
    (" to=self<|message|>Hmm.<|eot|>" + PARIS, {}, ("", "Hmm.", [])),
    # markup in reasoning or in an answer is text; so is a call where calls are not read
    (" to=user<|message|>Write " + PARIS.split("<|message|>")[1] + "<|eot|>", {},
     ("Write " + PARIS.split("<|message|>")[1], "", [])),
    (PARIS, {"calls": False}, (PARIS.strip(), "", [])),
    # a message to another recipient that holds no call, and text with no header: as written
    (" to=browser<|message|>cats<|eom|><|start|>assistant to=user<|message|>Hi", {},
     ("to=browser<|message|>cats", "", [])),
    ("Hello<|eot|>", {}, ("Hello", "", [])),
    # reasoning not split off: its text is content; with nothing to read, the reply as it is
    (" to=self<|message|>Hmm. <|eom|><|start|>assistant to=user<|message|>Hi", {"split": False}, ("Hmm. Hi", "", [])),
    (" to=self<|message|>Hmm.<|eom|><|start|>assistant to=user<|message|>Hi<|eot|>", {"split": False, "calls": False},
     ("to=self<|message|>Hmm.<|eom|><|start|>assistant to=user<|message|>Hi<|eot|>", "", [])),
    # a JSON answer, fenced or not
    (' to=user<|message|>```json\n{"a": 1}\n```<|eot|>', {"json_answer": True}, ('{"a": 1}', "", [])),
    (' to=self<|message|>JSON it is<|eom|><|start|>assistant to=user<|message|>{"a": 1}', {"json_answer": True},
     ('{"a": 1}', "JSON it is", [])),
    # a continued message: the prompt wrote the start of the reasoning
    ("on.<|eom|><|start|>assistant to=user<|message|>Hi", {"prefill": " to=self<|message|>Thinking "},
     ("Hi", "Thinking on.", [])),
]


@pytest.mark.parametrize("text, options, expected", CASES)
def test_whole_replies(text: str, options: dict, expected: tuple) -> None:
    assert read(text, reader(**options)) == expected


def _streamed(text: str, r: ReplyReader, cuts: list[int]) -> tuple[dict, list[dict]]:
    stream = r.stream()
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    deltas = [d for a, b in zip(bounds, bounds[1:]) for d in stream.feed(text[a:b])] + stream.finish()
    return assemble_message(deltas), deltas


@pytest.mark.parametrize("text, options, expected", CASES)
def test_streamed_a_character_at_a_time(text: str, options: dict, expected: tuple) -> None:
    r = reader(**options)
    message, deltas = _streamed(text, r, list(range(len(text))))
    assert message == parse_reply(text, r)
    assert all(v for d in deltas for k, v in d.items() if k != "tool_calls"), "no empty pieces"


PIECES = [" to=self<|message|>", " to=user<|message|>", " to=get_weather<|message|>", "<|message|>", "<|eom|>",
          "<|eot|>", "<|start|>assistant", "<|sta", "<|e", "<atem:function_calls>", "</atem:function_calls>",
          '<atem:invoke name="get_weather">', "</atem:invoke>", '<atem:parameter name="city">',
          '<atem:parameter name="days">', "</atem:parameter>", "Paris", "3", " ", "\n", "```json", "```", "{}"]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=25), cuts=st.lists(st.integers(0, 400), max_size=20),
       options=st.fixed_dictionaries({"split": st.booleans(), "calls": st.booleans(), "parallel": st.booleans(),
                                      "json_answer": st.booleans()}))
def test_a_stream_cut_anywhere_adds_up_to_the_parse(pieces: list[str], cuts: list[int], options: dict) -> None:
    text = "".join(pieces)
    r = reader(**options)
    assert _streamed(text, r, cuts)[0] == parse_reply(text, r)


def test_a_call_streams_its_arguments_and_without_parallel_calls_ends_the_reply() -> None:
    long = "the city of light, " * 10
    text = render("muse_glimmer", "get_weather", {"city": long}) + NEXT + OSLO
    stream = reader(parallel=False).stream()
    deltas, done_at = [], None
    for i, ch in enumerate(text):
        deltas += stream.feed(ch)
        if stream.done and done_at is None:
            done_at = i
    assert done_at == text.index("</atem:function_calls>") + len("</atem:function_calls>") - 1
    pieces = [tc for d in deltas for tc in d["tool_calls"]]
    assert pieces[0]["function"]["name"] == "get_weather" and len(pieces) > 20
    assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == {"city": long}
    assert stream.finish() == []


def test_a_forced_call_is_a_message_to_a_function_and_more_follow_with_parallel_calls(tokenizer) -> None:
    """As llama.cpp's grammar writes it, to any recipient: one call, or with parallel calls more,
    each in the next message (llama.cpp's ``tool_choice ("<|eom|>" "<|start|>assistant" tool_choice)*``)."""
    single = tool_call_grammar(TOOLS, "required", "muse_glimmer")
    several = tool_call_grammar(TOOLS, "required", "muse_glimmer", parallel=True)
    two = PARIS + NEXT + TIME
    for grammar in (single, several):
        assert accepts(tokenizer, grammar, PARIS)
        assert accepts(tokenizer, grammar, PARIS.replace(" to=get_weather", " to=weather.get_weather"))
        assert not accepts(tokenizer, grammar, " to=user<|message|>Hi")
    assert not accepts(tokenizer, single, two)
    assert accepts(tokenizer, several, two) and accepts(tokenizer, several, two + NEXT + OSLO)
    # the next call only in the next message: not in the same one, nor after the turn's end
    assert not accepts(tokenizer, several, PARIS + "\n" + TIME)
    assert not accepts(tokenizer, several, PARIS + "<|eot|><|start|>assistant" + TIME)
    assert not accepts(tokenizer, several, two + NEXT)
    named = tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, "muse_glimmer",
                              parallel=True)
    assert accepts(tokenizer, named, PARIS + NEXT + OSLO) and not accepts(tokenizer, named, two)
    assert read(PARIS, reader()) == ("", "", [("get_weather", {"city": "Paris", "days": 3})])


@pytest.mark.parametrize("lead", ["", " to=self<|message|>Two calls.<|eom|><|start|>assistant"])
def test_parallel_calls_are_read_whole_and_streamed(lead: str) -> None:
    """The replies the parallel grammar lets the model write: a call per message, each read, whole
    and streamed cut anywhere, each call under its own index; without parallel calls, the first."""
    text = lead + PARIS + NEXT + TIME + NEXT + OSLO
    calls = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {}), ("get_weather", {"city": "Oslo"})]
    r = reader()
    whole = parse_reply(text, r)
    assert read(text, r) == ("", "Two calls." if lead else "", calls)
    assert len({c["id"] for c in whole["tool_calls"]}) == 3
    message, deltas = _streamed(text, r, list(range(len(text))))
    assert message == whole
    assert [tc["index"] for d in deltas for tc in d.get("tool_calls", ()) if "id" in tc] == [0, 1, 2]
    for cut in range(len(text) + 1):
        assert _streamed(text, r, [cut])[0] == whole
    assert read(text, reader(parallel=False)) == ("", "Two calls." if lead else "", calls[:1])


def test_a_continued_message_is_written_and_read_as_llama_cpp_does() -> None:
    setup = ChatSetup.for_template(ChatTemplate(SOURCE, lenient=True))
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "reasoning_content": "The user greets.",
                                                "content": "Hel"}]
    prompt = chat_prompt(setup, chat, add_generation_prompt=False)
    assert prompt.text.endswith("<|eot|><|start|>assistant to=self<|message|>The user greets.<|eom|>"
                                "<|start|>assistant to=user<|message|>Hel")
    message = parse_reply("lo!<|eot|>", reply_reader(setup, prompt, None, "none", "auto"))
    assert (message["content"], message["reasoning_content"]) == ("Hello!", "The user greets.")
    thinking = chat_prompt(setup, chat[:1] + [{"role": "assistant", "reasoning_content": "The user"}],
                           add_generation_prompt=False)
    assert thinking.text.endswith("<|eot|><|start|>assistant to=self<|message|>The user")
    message = parse_reply(" greets.<|eom|><|start|>assistant to=user<|message|>Hi!",
                          reply_reader(setup, thinking, None, "none", "auto"))
    assert (message["content"], message["reasoning_content"]) == ("Hi!", "The user greets.")
