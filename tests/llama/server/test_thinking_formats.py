"""The official `openai` client against a real `ggmlpy serve` reads `reasoning_content` and
`tool_calls` for a Qwen3.5-style template (thinking, XML calls), a gpt-oss harmony template
and a Muse Glimmer template (messages to itself, ATEM calls), and the markup stays out of an
answer's content. SmolLM2 cannot write those syntaxes on its own, so each reply is scripted:
the request's `grammar` (llama-server's field) admits exactly one text, which the model then
writes token by token through the whole server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.llama.server.conftest import running

TEMPLATES = Path(__file__).resolve().parents[1] / "chat" / "templates"
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}]
QWEN_REPLY = ("Paris is in France.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
              "</parameter>\n</function>\n</tool_call>")
HARMONY_REPLY = ("<|channel|>analysis<|message|>Paris is in France.<|end|><|start|>assistant<|channel|>commentary "
                 'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
QWEN_ANSWER = "The user greets.\n</think>\n\nHello there!"
HARMONY_ANSWER = ("<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final"
                  "<|message|>Hello there!")
MUSE_REPLY = (" to=self<|message|>Paris is in France.<|eom|><|start|>assistant to=get_weather<|message|>"
              '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris'
              "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>")
MUSE_ANSWER = " to=self<|message|>The user greets.<|eom|><|start|>assistant to=user<|message|>Hello there!"
# template -> (a reply with reasoning and a call, a reply with reasoning and an answer)
REPLIES = {"Qwen3.5-4B": (QWEN_REPLY, QWEN_ANSWER), "openai-gpt-oss-120b": (HARMONY_REPLY, HARMONY_ANSWER),
           "muse-glimmer": (MUSE_REPLY, MUSE_ANSWER)}


def _exactly(text: str) -> str:
    """A GBNF grammar that admits `text` and nothing else."""
    return "root ::= " + json.dumps(text)


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module", params=sorted(REPLIES))
def served(request, smollm2_path):
    with running(smollm2_path, parallel=1, ctx_size=2048, chat_template=_template(request.param)) as s:
        yield request.param, s


def _client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300)


def _ask(client, reply: str, stream: bool, tools=WEATHER):
    return client.chat.completions.create(
        model="x", max_tokens=120, temperature=0, stream=stream, tools=tools,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        extra_body={"grammar": _exactly(reply)})


def test_reasoning_and_a_tool_call_read_by_the_openai_client(served):
    name, server = served
    client = _client(server)
    reply = REPLIES[name][0]
    choice = _ask(client, reply, stream=False).choices[0]
    message = choice.message
    assert message.reasoning_content == "Paris is in France."
    assert not message.content
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == \
        [("get_weather", {"city": "Paris"})]
    reasoning, content, calls = "", "", {}
    for chunk in _ask(client, reply, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
    assert reasoning == message.reasoning_content and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]


def test_an_answer_keeps_the_markup_out_of_the_content(served):
    name, server = served
    reply = REPLIES[name][1]
    message = _ask(_client(server), reply, stream=False, tools=None).choices[0].message
    assert message.reasoning_content == "The user greets." and message.content == "Hello there!"
