"""Anthropic's Messages API (`/v1/messages`, llama/server/anthropic_api.py), driven by the
official `anthropic` client (its `x-api-key` header included): the answer is the chat
completion the request converts to, streamed or not, with stop sequences, tool use and
tool results, token counting, and the refusals."""
from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.llama.server.conftest import API_KEY

SYSTEM = "Answer briefly."
MESSAGES = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0}   # the client takes sampling fields as extra body fields


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=60, max_retries=0)


def _chat(oai, messages, **kw):
    return oai.chat.completions.create(model="smol", messages=messages, temperature=0, **kw)


def test_a_message_is_the_chat_completion_it_converts_to(claude, oai):
    m = claude.messages.create(model="smol", system=SYSTEM, messages=MESSAGES, max_tokens=16,
                               extra_body=GREEDY)
    chat = _chat(oai, [{"role": "system", "content": SYSTEM}] + MESSAGES, max_tokens=16)
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.content[0].text == chat.choices[0].message.content
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 16
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    count = claude.messages.count_tokens(model="smol", system=SYSTEM, messages=MESSAGES)
    assert count.input_tokens == chat.usage.prompt_tokens


def test_the_stream_concatenates_to_the_message(claude):
    kw = dict(model="smol", system=SYSTEM, messages=MESSAGES, max_tokens=16, extra_body=GREEDY)
    whole = claude.messages.create(**kw)
    kinds = []
    with claude.messages.stream(**kw) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert kinds[0] == "message_start" and "content_block_delta" in kinds and "message_stop" in kinds


def test_stop_sequences(claude):
    whole = claude.messages.create(model="smol", system=SYSTEM, messages=MESSAGES, max_tokens=32,
                                   extra_body=GREEDY).content[0].text
    word = whole.split()[2]   # a word the greedy text reaches
    m = claude.messages.create(model="smol", system=SYSTEM, messages=MESSAGES, max_tokens=32,
                               stop_sequences=[word], extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == whole[:whole.index(word)]


def test_tool_use_and_tool_results(claude):
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                               "required": ["city"]}}]
    kw = dict(model="smol", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
              tool_choice={"type": "any"}, max_tokens=60, extra_body=GREEDY)
    m = claude.messages.create(**kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses[0].name == "get_weather" and "city" in uses[0].input
    started, pieces = [], []
    with claude.messages.stream(**kw) as stream:   # as llama-server: the block once the name is whole,
        for event in stream:                      # then the input as it grows
            if event.type == "content_block_start" and event.content_block.type == "tool_use":
                started.append(event.content_block)
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                assert started, "the input came before its block started"
                pieces.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(u.name, u.input) for u in uses]
    assert [(b.id, b.name) for b in started] == [(u.id, u.name) for u in uses]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == uses[0].input
    follow = claude.messages.create(model="smol", tools=tools, max_tokens=8, extra_body=GREEDY, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                           "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "sunny, 21 C"}]}])
    assert follow.usage.input_tokens + follow.usage.cache_read_input_tokens > \
        m.usage.input_tokens + m.usage.cache_read_input_tokens


@pytest.mark.parametrize("body, status, message", [
    ({"max_tokens": 4}, 400, "'messages' is required"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, 400, "unknown content block type"),
    # an image for a model without a vision projector: llama-server's 500 and message
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 500,
     "image input is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": "File: a.png"}, {"type": "image", "source": {}}]}]}]}, 500,
     "image input is not supported"),
])
def test_refusals(server, body, status, message):
    r = httpx.post(server.url + "/v1/messages", json={"model": "smol", **body},
                   headers={"x-api-key": API_KEY}, timeout=60)
    assert r.status_code == status and message in r.json()["error"]["message"]


def test_an_empty_chat_is_answered(server):
    """llama-server answers a Messages request without messages (an empty user turn)."""
    r = httpx.post(server.url + "/v1/messages", json={"model": "smol", "max_tokens": 4, "messages": []},
                   headers={"x-api-key": API_KEY}, timeout=60)
    assert r.status_code == 200 and r.json()["type"] == "message"


@pytest.mark.parametrize("thinking,budget", [({"type": "enabled", "budget_tokens": 512}, 512),
                                             ({"type": "enabled"}, 10000), ({"type": "disabled"}, None)])
def test_thinking_becomes_the_reasoning_budget(thinking, budget):
    """As llama-server's conversion: an enabled `thinking` sets thinking_budget_tokens
    (10000 when it names no budget); a disabled one sets nothing."""
    from llama.server.anthropic_api import chat_body
    body = chat_body({"messages": [{"role": "user", "content": "hi"}], "thinking": thinking})
    assert body.get("thinking_budget_tokens") == budget
