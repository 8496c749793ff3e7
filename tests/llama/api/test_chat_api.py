"""create_chat_completion: template -> prompt, OpenAI shapes, streaming, structured output
(validated with jsonschema), tool calls (forced, and parsed in auto mode)."""
import json
from pathlib import Path

import jsonschema
import pytest

from llama import Llama
from llama.chat import ChatTemplateError
from llama.chat.tool_calls import assemble_deltas

TEMPLATES = Path(__file__).resolve().parents[1] / "chat" / "templates"
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}}}


def test_the_prompt_is_the_files_template(smol):
    text = smol.apply_chat_template(HELLO)
    assert text == (f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n<|im_start|>user\n"
                    "What is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    out = smol.create_chat_completion(HELLO, max_tokens=16, temperature=0)
    same = smol.create_completion(text, max_tokens=16, temperature=0)
    assert out["usage"] == same["usage"]
    assert out["choices"][0]["message"] == {"role": "assistant", "content": same["choices"][0]["text"]}
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                          {"type": "text", "text": "of France?"}]}]
    assert smol.apply_chat_template(parts) == text


def test_chat_with_mirostat_is_the_completion_with_mirostat(smol):
    """create_chat_completion passes mirostat to the chain as create_completion does: the
    same seed and parameters over the template's text give the same tokens."""
    text = smol.apply_chat_template(HELLO)
    args = dict(max_tokens=16, temperature=0.9, mirostat_mode=2, mirostat_tau=4.0, mirostat_eta=0.2, seed=77)
    out = smol.create_chat_completion(HELLO, **args)
    same = smol.create_completion(text, **args)
    assert out["choices"][0]["message"]["content"] == same["choices"][0]["text"]
    assert same["choices"][0]["text"] != smol.create_completion(text, **dict(args, mirostat_mode=0))["choices"][0]["text"]


def test_stream_shape_and_usage(smol):
    whole = smol.create_chat_completion(HELLO, max_tokens=20, temperature=0)
    chunks = list(smol.create_chat_completion(HELLO, max_tokens=20, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    body = chunks[1:-2]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in body) == \
        whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 18, "maximum": 99}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                      "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,6}$"},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["colour", "tags"]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.8, 1), (0.8, 2)])
def test_json_schema_output_validates(smol, schema, temperature, seed):
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    out = smol.create_chat_completion(msgs, response_format=fmt, temperature=temperature, seed=seed,
                                      max_tokens=120)
    assert out["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), schema)


def test_json_object_forms(smol):
    msgs = [{"role": "user", "content": "Return a JSON object with the keys city and country for Paris."}]
    plain = smol.create_chat_completion(msgs, response_format={"type": "json_object"},
                                        temperature=0, max_tokens=120)
    assert isinstance(json.loads(plain["choices"][0]["message"]["content"]), dict)
    schema = SCHEMAS[0]
    typed = smol.create_chat_completion(msgs, response_format={"type": "json_object", "schema": schema},
                                        temperature=0, max_tokens=120)
    jsonschema.validate(json.loads(typed["choices"][0]["message"]["content"]), schema)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_call(smol, choice):
    msgs = [{"role": "user", "content": "What's the weather in Paris for 3 days?"}]
    out = smol.create_chat_completion(msgs, tools=[WEATHER, TIME], tool_choice=choice, temperature=0,
                                      max_tokens=120)
    choice0 = out["choices"][0]
    assert choice0["finish_reason"] == "tool_calls"
    calls = choice0["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["type"] == "function"
    name = calls[0]["function"]["name"]
    if isinstance(choice, dict):
        assert name == "get_time"
    tool = {"get_weather": WEATHER, "get_time": TIME}[name]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), tool["function"]["parameters"])
    chunks = list(smol.create_chat_completion(msgs, tools=[WEATHER, TIME], tool_choice=choice,
                                              temperature=0, max_tokens=120, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    content, streamed = assemble_deltas(deltas)
    assert [c["function"] for c in streamed] == [c["function"] for c in calls]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_tool_choice_parses_hermes_calls(smollm2_path):
    """With a Hermes-style template (Qwen 2.5's), text the model writes as a <tool_call>
    block comes back as tool_calls. The grammar makes this model write one."""
    qwen = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    llm = Llama(str(smollm2_path), n_ctx=1024, chat_template=qwen, verbose=False)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    grammar = f'root ::= "Checking. " "{json.dumps(call)[1:-1]}"'.replace("\\n", "\\n")
    from llama.grammar import LlamaGrammar
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = llm.apply_chat_template(msgs, tools=[WEATHER])
    assert "<tools>" in prompt and "get_weather" in prompt
    out = llm.create_chat_completion(msgs, tools=[WEATHER], tool_choice="auto", temperature=0,
                                     max_tokens=80, grammar=LlamaGrammar.from_string(grammar))
    msg = out["choices"][0]["message"]
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert msg["content"] == "Checking."
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "days": 2}
    none = llm.create_chat_completion(msgs, tools=[WEATHER], tool_choice="none", temperature=0,
                                      max_tokens=80, grammar=LlamaGrammar.from_string(grammar))
    assert none["choices"][0]["message"]["content"].startswith("Checking. <tool_call>")


def test_a_streamed_call_comes_as_llama_server_streams_it(smollm2_path):
    """create_chat_completion(stream=True): a call's first chunk has its index, id, type, name and
    the arguments so far, the later ones its index and what the arguments grew by; they add up
    to the call of the unstreamed answer. With parallel_tool_calls false only the first of two
    calls comes back, and the reply ends where the second begins."""
    qwen = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    llm = Llama(str(smollm2_path), n_ctx=1024, chat_template=qwen, verbose=False)
    from llama.grammar import LlamaGrammar

    def call(city):
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s", "days": 2}}\n</tool_call>' % city

    def ask(text, **kw):
        grammar = LlamaGrammar.from_string("root ::= " + json.dumps(text))
        return llm.create_chat_completion([{"role": "user", "content": "Weather?"}], tools=[WEATHER],
                                          temperature=0, max_tokens=200, grammar=grammar, **kw)

    long_city = "Tallinn " * 12
    whole = ask(call(long_city))["choices"][0]["message"]["tool_calls"]
    parts = [tc for c in ask(call(long_city), stream=True) for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert set(parts[0]) == {"index", "id", "type", "function"} and set(parts[0]["function"]) == {"name", "arguments"}
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in parts[1:])
    assert len(parts) > 3 and "".join(p["function"]["arguments"] for p in parts) == whole[0]["function"]["arguments"]
    assert parts[0]["id"] == whole[0]["id"] and json.loads(whole[0]["function"]["arguments"])["city"] == long_city
    two = call("Paris") + "\n" + call("Oslo")
    assert len(ask(two)["choices"][0]["message"]["tool_calls"]) == 2   # Qwen's template writes several
    one = ask(two, parallel_tool_calls=False)
    assert [json.loads(c["function"]["arguments"])["city"] for c in one["choices"][0]["message"]["tool_calls"]] == [
        "Paris"]
    assert one["usage"]["completion_tokens"] < ask(two)["usage"]["completion_tokens"]


def test_chat_logprobs(smol):
    out = smol.create_chat_completion(HELLO, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    text = "".join(e["token"] for e in content)
    assert text == out["choices"][0]["message"]["content"]
    for e in content:
        assert len(e["top_logprobs"]) == 3 and e["logprob"] == pytest.approx(e["top_logprobs"][0]["logprob"])
        assert bytes(e["bytes"]).decode() == e["token"]


def test_bad_requests_are_named(smol):
    with pytest.raises(ValueError, match="response_format"):
        smol.create_chat_completion(HELLO, response_format={"type": "yaml"})
    with pytest.raises(ValueError, match=r"content\[0\].*image_url"):
        smol.create_chat_completion([{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(ValueError, match="role"):
        smol.create_chat_completion([{"role": "wizard", "content": "hi"}])
    with pytest.raises(ValueError, match=r"messages\[1\] \(user\) has no 'content'"):
        smol.create_chat_completion([{"role": "system", "content": "Be brief."}, {"role": "user"}])
    with pytest.raises(ValueError, match="not among the tools"):
        smol.create_chat_completion(HELLO, tools=[WEATHER],
                                    tool_choice={"type": "function", "function": {"name": "nope"}})


def test_a_hostile_template_fails_only_when_chat_is_used(smollm2_path, tmp_path):
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    llm = Llama(str(smollm2_path), n_ctx=256, chat_template=evil, verbose=False)
    assert llm("Hello", max_tokens=2, temperature=0)["choices"][0]["text"]
    with pytest.raises(ChatTemplateError):
        llm.create_chat_completion(HELLO, max_tokens=2)


def test_second_chat_turn_decodes_only_its_new_tokens(smol):
    from llama import Batch, Context
    from llama.api.logprobs import log_softmax
    smol.reset()
    first = smol.create_chat_completion(HELLO, max_tokens=12, temperature=0)
    turn2 = HELLO + [first["choices"][0]["message"], {"role": "user", "content": "And of Italy?"}]
    ids2 = smol._chat.tokens(smol.apply_chat_template(turn2))
    cached = list(smol.input_ids)
    shared = next(i for i, (a, b) in enumerate(zip(cached + [-1], ids2)) if a != b)
    # the reply as the template writes it back is what the cache holds, up to its end marker
    assert shared >= first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1
    before = smol.engine.n_prompt_decoded
    second = smol.create_chat_completion(turn2, max_tokens=1, temperature=0, logprobs=True)
    assert smol.engine.n_prompt_decoded - before == len(ids2) - shared
    assert second["usage"]["prompt_tokens"] == len(ids2)
    ctx = Context(smol.model, n_ctx=1024, n_threads=2)
    assert ctx.decode(Batch.from_tokens(ids2)) == 0
    fresh = log_softmax(ctx.get_logits_ith(-1))
    assert second["choices"][0]["logprobs"]["content"][0]["logprob"] == pytest.approx(fresh.max(), abs=2e-3)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_xml_tool_call(smollm2_path, choice):
    """Qwen3-Coder's XML format: the grammar makes SmolLM2 write one call in it, whose values
    come back typed by the tool's schema (`days` an integer), whole and streamed alike. (The
    template writes several calls, so without parallel_tool_calls false the grammar would let
    the model go on to more, as llama-server's does.)"""
    coder = (TEMPLATES / "Qwen3-Coder.jinja").read_text()
    llm = Llama(str(smollm2_path), n_ctx=2048, chat_template=coder, verbose=False)
    msgs = [{"role": "user", "content": "What's the weather in Paris for 3 days?"}]
    out = llm.create_chat_completion(msgs, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=120,
                                     parallel_tool_calls=False)
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    calls = out["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1
    tool = {"get_weather": WEATHER, "get_time": TIME}[calls[0]["function"]["name"]]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), tool["function"]["parameters"])
    chunks = list(llm.create_chat_completion(msgs, tools=[WEATHER, TIME], tool_choice=choice, temperature=0,
                                             max_tokens=120, stream=True, parallel_tool_calls=False))
    _, streamed = assemble_deltas([c["choices"][0]["delta"] for c in chunks[1:]])
    assert [c["function"] for c in streamed] == [c["function"] for c in calls]
