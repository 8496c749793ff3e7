"""Tool calls streamed by a real `ggmlpy serve` as llama-server streams them, read by the official
`openai` client: a call's first chunk carries its index, id, type, name and the arguments so far,
the later ones its index and what the arguments grew by, and what the client folds together is
the call of the non-streamed answer. Replies are scripted as in test_thinking_formats.py: the
request's `grammar` admits one text, which SmolLM2 then writes token by token. With
`parallel_tool_calls` false a reply with two calls gives one, and ends where the second begins."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.llama.server.conftest import running

TEMPLATES = Path(__file__).resolve().parents[1] / "chat" / "templates"
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}]
CITY = "Llanfairpwllgwyngyll, " * 12 + 'the "long" one'
CALLS = {   # a family's call of get_weather, its opening before the call
    "Qwen-Qwen2.5-7B-Instruct": ("Checking.\n",
                                 '<tool_call>\n{"name": "get_weather", "arguments": {"city": %s}}\n</tool_call>'),
    "Qwen3.5-4B": ("The user asks.\n</think>\n\n", "<tool_call>\n<function=get_weather>\n<parameter=city>\n%s\n"
                                                   "</parameter>\n</function>\n</tool_call>"),
}


def _calls(name: str, *cities: str) -> str:
    """The reply with a call per city."""
    lead, call = CALLS[name]
    quote = json.dumps if name.startswith("Qwen-") else str
    return lead + "\n".join(call % quote(city) for city in cities)


@pytest.fixture(scope="module", params=sorted(CALLS))
def served(request, smollm2_path):
    chat_template = (TEMPLATES / f"{request.param}.jinja").read_text(encoding="utf-8")
    with running(smollm2_path, parallel=1, ctx_size=2048, chat_template=chat_template) as s:
        yield request.param, s


def _ask(server, reply: str, stream: bool, **extra):
    from openai import OpenAI
    client = OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300)
    return client.chat.completions.create(
        model="x", max_tokens=400, temperature=0, stream=stream, tools=WEATHER,
        messages=[{"role": "user", "content": "What is the weather in the town with the long name?"}],
        extra_body={"grammar": "root ::= " + json.dumps(reply), **extra})


def test_a_call_streams_as_llama_server_streams_it(served):
    name, server = served
    reply = _calls(name, CITY)
    choice = _ask(server, reply, stream=False).choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": CITY}

    parts, finish = [], None
    for chunk in _ask(server, reply, stream=True):
        if chunk.choices:
            parts += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    first, rest = parts[0], parts[1:]
    assert (first.index, first.id, first.type, first.function.name) == (0, call.id, "function", "get_weather")
    assert first.function.arguments is not None
    assert all(p.index == 0 and p.id is None and p.type is None and p.function.name is None for p in rest)
    assert sum(1 for p in parts if p.function.arguments) > 3   # the long argument comes in pieces
    assert "".join(p.function.arguments or "" for p in parts) == call.function.arguments
    assert finish == "tool_calls"


def test_without_parallel_calls_the_first_call_alone(served):
    name, server = served
    two = _calls(name, "Paris", "Oslo")
    many = _ask(server, two, stream=False)
    assert [json.loads(c.function.arguments)["city"] for c in many.choices[0].message.tool_calls] == ["Paris", "Oslo"]
    one = _ask(server, two, stream=False, parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"] for c in one.choices[0].message.tool_calls] == ["Paris"]
    assert one.choices[0].finish_reason == "tool_calls"
    assert one.usage.completion_tokens < many.usage.completion_tokens   # it ended where the second call began

