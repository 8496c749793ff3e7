"""OpenAI's Responses API (`/v1/responses`, llama/server/responses_api.py), driven by the
official `openai` client's `responses.create` and `responses.stream` (which checks the
events' indices and identities): the answer is the chat completion the request converts to,
streamed or not, with structured output and tool calls, and llama-server's refusals."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.llama.server.conftest import API_KEY

SYSTEM = "Answer briefly."
QUESTION = "Name three colors."


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=60, max_retries=0)


def _chat(oai, messages, **kw):
    return oai.chat.completions.create(model="smol", messages=messages, temperature=0, **kw)


def test_a_response_is_the_chat_completion_it_converts_to(oai):
    r = oai.responses.create(model="smol", instructions=SYSTEM, input=QUESTION,
                             max_output_tokens=24, temperature=0)
    chat = _chat(oai, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
                 max_tokens=24)
    assert r.status == "completed" and r.object == "response"
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                             chat.usage.completion_tokens)
    assert r.output[0].type == "message" and r.output[0].role == "assistant"


def test_the_stream_concatenates_to_the_response(oai):
    kw = dict(model="smol", instructions=SYSTEM, input=QUESTION, max_output_tokens=24, temperature=0)
    whole = oai.responses.create(**kw)
    text, kinds, numbers = "", [], []
    with oai.responses.stream(**kw) as stream:
        for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = stream.get_final_response()
    assert text == final.output_text == whole.output_text
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta")
    assert numbers == list(range(len(numbers)))


def test_input_items_make_the_conversation(oai):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ann."}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello Ann!"}]},
             {"role": "user", "content": "What is my name?"}]
    r = oai.responses.create(model="smol", input=items, max_output_tokens=16, temperature=0)
    chat = _chat(oai, [{"role": "user", "content": "Hi, I am Ann."},
                       {"role": "assistant", "content": "Hello Ann!"},
                       {"role": "user", "content": "What is my name?"}], max_tokens=16)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_json_schema_text_format_validates(oai):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = oai.responses.create(model="smol", input="A person as JSON.", max_output_tokens=60,
                             temperature=0, text={"format": {"type": "json_schema", "name": "p",
                                                             "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_function_calls(oai):
    tools = [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"]}}]
    kw = dict(model="smol", input="Weather in Paris?", tools=tools,
              tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
              temperature=0)
    r = oai.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    with oai.responses.stream(**kw) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in calls]
    assert "response.function_call_arguments.done" in kinds
    # the call's output goes back as an item: the next turn reads it
    follow = oai.responses.create(model="smol", tools=tools, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
    assert follow.status == "completed" and follow.usage.input_tokens > r.usage.input_tokens


@pytest.mark.parametrize("body, message", [
    ({}, "'input' is required"),
    ({"input": "x", "previous_response_id": "resp_1"}, "does not support 'previous_response_id'"),
    ({"input": 3}, "'input' must be a string or array of objects"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "'input_image' is not supported"),
    ({"input": [{"foo": 1}]}, "Cannot determine type of 'item'"),
    ({"input": "x", "n": 2}, "'n' must be 1"),
])
def test_refusals_are_400s(server, body, message):
    r = httpx.post(server.url + "/v1/responses", json={"model": "smol", **body},
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_chat_content_null_beside_tool_calls_is_empty_text(oai):
    """What OpenAI clients send for an assistant turn that only called a tool: llama-server
    reads the null content as empty text (SmolLM2's template reads it unconditionally)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    base = [{"role": "user", "content": "Weather in Paris?"}]
    tail = [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    null = _chat(oai, base + [{"role": "assistant", "content": None, "tool_calls": [call]}] + tail,
                 tools=tools, max_tokens=8)
    empty = _chat(oai, base + [{"role": "assistant", "content": "", "tool_calls": [call]}] + tail,
                  tools=tools, max_tokens=8)
    assert null.choices[0].message.content == empty.choices[0].message.content
    assert null.usage.prompt_tokens == empty.usage.prompt_tokens


def test_input_tokens_endpoints_count_the_rendered_prompt(server, oai):
    """llama-server's /v1/chat/completions/input_tokens and /v1/responses/input_tokens: the
    prompt tokens the chat would decode (its usage's prompt_tokens)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    want = _chat(oai, messages, max_tokens=1).usage.prompt_tokens
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for path, body in (("/v1/chat/completions/input_tokens", {"messages": messages}),
                       ("/v1/responses/input_tokens", {"instructions": SYSTEM, "input": QUESTION})):
        r = httpx.post(server.url + path, json={"model": "smol", **body}, headers=headers, timeout=60)
        assert r.json() == {"input_tokens": want, "object": "response.input_tokens"}
