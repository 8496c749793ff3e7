"""The OpenAI and llama-server endpoints, driven by the official `openai` client and
plain HTTP against a real uvicorn server."""
from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

from tests.llama.server.conftest import API_KEY


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=60, max_retries=0)


MSGS = [{"role": "user", "content": "Name three colors."}]


def test_chat_stream_concatenates_to_the_non_streamed_text(oai):
    full = oai.chat.completions.create(model="smol", messages=MSGS, max_tokens=12, temperature=0)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    parts = [c.choices[0].delta.content or "" for c in
             oai.chat.completions.create(model="smol", messages=MSGS, max_tokens=12,
                                         temperature=0, stream=True) if c.choices]
    assert "".join(parts) == full.choices[0].message.content != ""


def test_any_model_name_is_served_by_the_loaded_model(oai):
    """llama-server's single-model mode: a request may name any model (the clients written for
    OpenAI send theirs); the answer names the server's and carries a system fingerprint."""
    ours = oai.completions.create(model="smol", prompt="The capital of France is", max_tokens=6, temperature=0)
    other = oai.completions.create(model="davinci-002", prompt="The capital of France is", max_tokens=6,
                                   temperature=0)
    chat = oai.chat.completions.create(model="gpt-3.5-turbo", messages=MSGS, max_tokens=4, temperature=0)
    assert other.choices[0].text == ours.choices[0].text
    assert other.model == chat.model == "smol"
    assert other.system_fingerprint.startswith("b") and chat.system_fingerprint == other.system_fingerprint
    chunks = list(oai.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=3, temperature=0,
                                              stream=True))
    assert chunks and all(c.system_fingerprint == other.system_fingerprint for c in chunks)


def test_completion_and_llama_server_completion_agree(oai, server):
    out = oai.completions.create(model="smol", prompt="The capital of France is", max_tokens=6,
                                 temperature=0)
    with server.client() as c:
        native = c.post("/completion", json={"prompt": "The capital of France is",
                                             "n_predict": 6, "temperature": 0}).json()
    assert out.choices[0].text == native["content"]
    assert native["tokens_predicted"] == 6 and native["stop_type"] == "limit"


def test_mirostat_fields(oai, server):
    """llama-server's mirostat fields reach the sampler: the same seed gives the same text
    twice and another text than the default chain; a target surprise near 0 is greedy;
    the OpenAI endpoints take them as extra fields; a version other than 0-2 is a 400."""
    body = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0.9, "seed": 1234}
    miro = dict(body, mirostat=2, mirostat_tau=4.0, mirostat_eta=0.2)
    with server.client() as c:
        texts = [c.post("/completion", json=b).json()["content"] for b in (miro, miro, body)]
        greedy = c.post("/completion", json=dict(body, temperature=0)).json()["content"]
        tiny = c.post("/completion", json=dict(body, mirostat=1, mirostat_tau=0.01)).json()["content"]
        bad = c.post("/completion", json=dict(body, mirostat=5))
    assert texts[0] == texts[1] != texts[2]
    assert tiny == greedy
    assert bad.status_code == 400 and "mirostat" in bad.json()["error"]["message"]
    out = oai.completions.create(model="smol", prompt=body["prompt"], max_tokens=12, temperature=0.9,
                                 seed=1234, extra_body={"mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2})
    assert out.choices[0].text == texts[0]


@pytest.mark.parametrize("extra, status", [
    ({"repeat_last_n": -1, "repeat_penalty": 1.3, "min_keep": 2, "dynatemp_range": 0.5}, 200),
    ({"xtc_probability": 1.0, "xtc_threshold": 0.01}, 200),
    ({"top_n_sigma": 0.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}, 200),
    ({"xtc_probability": "often"}, 400),
    ({"repeat_last_n": -2}, 400),
    ({"min_keep": -1}, 400),
    ({"dynatemp_range": -1}, 400),
    ({"repeat_last_n": "all"}, 400),
    ({"dry_sequence_breakers": []}, 400),
    ({"dry_sequence_breakers": "\n"}, 400),
    ({"dry_sequence_breakers": [str(i) for i in range(65)]}, 400),
    ({"dry_allowed_length": -1}, 400),
    ({"dry_penalty_last_n": -2}, 400),
    ({"samplers": ["top_k", "bogus"]}, 400),
    ({"samplers": 5}, 400),
])
def test_llama_server_sampling_fields(server, extra, status):
    """repeat_last_n, min_keep, dynatemp_*, top_n_sigma and xtc_* are read (a bad value is a
    400 naming it); with a seed, each changes the text."""
    body = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 1.0, "seed": 4321}
    with server.client() as c:
        r = c.post("/completion", json=dict(body, **extra))
        assert r.status_code == status, r.text
        if status != 200:
            assert next(iter(extra)) in r.json()["error"]["message"]
            return
        plain = c.post("/completion", json=body).json()["content"]
        assert r.json()["content"] == c.post("/completion", json=dict(body, **extra)).json()["content"] != plain


def test_dry_and_sampler_order_fields(oai, server):
    """DRY breaks a greedy loop unless its breakers cut every repeat; `samplers` picks the
    chain: top-k alone with k = 1 is greedy whatever the temperature, the temperature alone
    samples the whole vocabulary."""
    body = {"prompt": "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,", "n_predict": 12,
            "temperature": 0, "cache_prompt": False}
    dry = dict(body, dry_multiplier=0.8, dry_penalty_last_n=-1)
    with server.client() as c:
        def text(**extra) -> str:
            r = c.post("/completion", json=dict(body, **extra))
            assert r.status_code == 200, r.text
            return r.json()["content"]
        plain = text()
        assert plain.startswith(" 3, 1, 2, 3")
        dry_text = text(**dry)
        assert dry_text != plain
        assert text(**dict(dry, dry_sequence_breakers=[","])) == plain
        assert text(temperature=1.5, seed=9, samplers="k", top_k=1) == plain
        assert text(temperature=1.5, seed=9, samplers=["temperature"]) != plain
    out = oai.completions.create(model="smol", prompt=body["prompt"], max_tokens=12, temperature=0,
                                 extra_body={"dry_multiplier": 0.8, "dry_penalty_last_n": -1})
    assert out.choices[0].text == dry_text   # the OpenAI endpoints take them as extra fields


def test_completion_response_options(server):
    """llama-server's return_tokens, response_fields, timings_per_token, generation_settings
    and t_max_predict_ms on /completion."""
    body = {"prompt": "1\n2\n3\n4\n5\n", "n_predict": 24, "temperature": 0.3, "seed": 2,
            "top_k": 7, "cache_prompt": False}
    with server.client() as c:
        plain = c.post("/completion", json=body).json()
        with_ids = c.post("/completion", json=dict(body, return_tokens=True)).json()
        assert plain["tokens"] == [] and len(with_ids["tokens"]) == 24
        text = c.post("/detokenize", json={"tokens": with_ids["tokens"]}).json()["content"]
        assert text == with_ids["content"] == plain["content"]
        settings = plain["generation_settings"]
        assert (settings["temperature"], settings["top_k"], settings["n_predict"], settings["seed"]) == (0.3, 7, 24, 2)
        picked = c.post("/completion", json=dict(body, response_fields=[
            "content", "timings/predicted_n", "generation_settings/top_k", "no/such"])).json()
        assert picked == {"content": plain["content"], "timings/predicted_n": 24,
                          "generation_settings/top_k": 7}
        # every streamed chunk carries timings, predicted_n counting up
        lines = [json.loads(line[6:]) for line in c.post("/completion", json=dict(
            body, stream=True, timings_per_token=True)).text.splitlines() if line.startswith("data: ")]
        counts = [chunk["timings"]["predicted_n"] for chunk in lines]
        assert len(counts) >= 10 and counts == sorted(counts) and counts[-1] == 24
        lines = [json.loads(line[6:]) for line in c.post("/completion", json=dict(body, stream=True)).text.splitlines()
                 if line.startswith("data: ")]
        assert [("timings" in chunk) for chunk in lines] == [False] * (len(lines) - 1) + [True]
        # past 1 ms, the first token holding a newline ends the generation
        limited = c.post("/completion", json=dict(body, t_max_predict_ms=1)).json()
        assert limited["stop_type"] == "limit" and limited["tokens_predicted"] < 24
        assert limited["content"].endswith("\n") and plain["content"].startswith(limited["content"])
        for bad in ({"t_max_predict_ms": -1}, {"response_fields": "content"}, {"return_tokens": 1}):
            r = c.post("/completion", json=dict(body, **bad))
            assert r.status_code == 400 and next(iter(bad)) in r.json()["error"]["message"]


def test_completion_probabilities(oai, server):
    """/completion's n_probs: llama-server's completion_probabilities, from the model's
    distribution (the same logprobs as the OpenAI endpoint's for the same draw) or, with
    post_sampling_probs, the chain's final probabilities; streamed, spread over the chunks."""
    body = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0.8, "seed": 1,
            "n_probs": 3, "cache_prompt": False}
    with server.client() as c:
        raw = c.post("/completion", json=body).json()
        post = c.post("/completion", json=dict(body, post_sampling_probs=True)).json()
        lines = [json.loads(line[6:]) for line in c.post("/completion", json=dict(body, stream=True)).text.splitlines()
                 if line.startswith("data: ")]
    probs = raw["completion_probabilities"]
    assert len(probs) == 6 and all(len(p["top_logprobs"]) == 3 for p in probs)
    for p in probs:
        tops = [t["logprob"] for t in p["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and p["logprob"] <= tops[0] <= 0
        assert bytes(p["bytes"]).decode("utf-8", "replace").startswith(p["token"])
    oai_lp = oai.completions.create(model="smol", prompt=body["prompt"], max_tokens=6, temperature=0.8,
                                    seed=1, logprobs=3, extra_body={"cache_prompt": False}).choices[0].logprobs
    assert [p["token"] for p in probs] == oai_lp.tokens
    assert [p["logprob"] for p in probs] == pytest.approx(oai_lp.token_logprobs, abs=1e-6)
    assert post["content"] == raw["content"]
    for p in post["completion_probabilities"]:
        chain = [t["prob"] for t in p["top_probs"]]
        assert 0 < p["prob"] <= 1 and sum(chain) <= 1 + 1e-5 and chain == sorted(chain, reverse=True)
        assert p["id"] not in [t["id"] for t in p["top_probs"]] or p["prob"] in chain
    streamed = [p for chunk in lines for p in chunk.get("completion_probabilities", [])]
    assert [p["id"] for p in streamed] == [p["id"] for p in probs]
    assert "completion_probabilities" not in lines[-1]


def test_n_choices(oai, server):
    """OpenAI's n: choice i is what n = 1 gives with seed + i, the prompt counted once in the
    usage; streamed, each choice's chunks carry its index and join to the same texts."""
    msgs = [{"role": "user", "content": "Name a fruit."}]
    fresh = {"cache_prompt": False}   # every prompt decoded from the start: the same logits
    one = [oai.chat.completions.create(model="smol", messages=msgs, max_tokens=10, temperature=1.0,
                                       seed=11 + i, extra_body=fresh) for i in range(3)]
    stats = server.state.scheduler.stats
    before = stats.n_prompt_tokens
    three = oai.chat.completions.create(model="smol", messages=msgs, max_tokens=10, temperature=1.0,
                                        seed=11, n=3, extra_body=fresh)
    # the first choice decodes the prompt; the others share its cells but for the last token
    assert stats.n_prompt_tokens - before == three.usage.prompt_tokens + 2
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.message.content for c in three.choices] == [o.choices[0].message.content for o in one]
    assert len({c.message.content for c in three.choices}) > 1
    assert three.usage.prompt_tokens == one[0].usage.prompt_tokens
    assert three.usage.completion_tokens == sum(o.usage.completion_tokens for o in one)
    texts, text_usage = ["", ""], []
    for chunk in oai.completions.create(model="smol", prompt="Once upon a time", max_tokens=12,
                                        temperature=1.0, seed=3, n=2, stream=True, extra_body=fresh,
                                        stream_options={"include_usage": True}):
        if chunk.usage is not None:
            text_usage.append(chunk.usage)
        for c in chunk.choices:
            texts[c.index] += c.text
    whole = oai.completions.create(model="smol", prompt="Once upon a time", max_tokens=12,
                                   temperature=1.0, seed=3, n=2, extra_body=fresh)
    assert texts == [c.text for c in whole.choices] and texts[0] != texts[1]
    assert whole.usage.completion_tokens == 24 and len(text_usage) == 1
    assert text_usage[0].completion_tokens == 24 and text_usage[0].prompt_tokens == whole.usage.prompt_tokens
    usages, finished = [], set()
    for chunk in oai.chat.completions.create(model="smol", messages=msgs, max_tokens=10, temperature=1.0,
                                             seed=11, n=3, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usages.append(chunk.usage)
        finished |= {c.index for c in chunk.choices if c.finish_reason}
    assert finished == {0, 1, 2} and len(usages) == 1   # one usage chunk, for every choice
    assert usages[0].completion_tokens == three.usage.completion_tokens
    with server.client() as c:
        for bad in ({"n": 0}, {"n": 5}, {"n": "2"}):
            r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, **bad})
            assert r.status_code == 400 and "'n'" in r.json()["error"]["message"]
        r = c.post("/completion", json={"prompt": "a", "n_predict": 2, "n_cmpl": 2})
        assert r.status_code == 400 and "n_cmpl" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 200


def test_several_prompts_in_one_completion_request(oai):
    """OpenAI's array of prompts: prompt k's choice j is choice k * n + j, each what the
    prompt alone gives, each prompt counted once in the usage; streamed the same."""
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"]
    fresh = {"cache_prompt": False}
    alone = [oai.completions.create(model="smol", prompt=p, max_tokens=6, temperature=0, extra_body=fresh)
             for p in prompts]
    together = oai.completions.create(model="smol", prompt=prompts, max_tokens=6, temperature=0, extra_body=fresh)
    assert [c.index for c in together.choices] == [0, 1, 2]
    assert [c.text for c in together.choices] == [a.choices[0].text for a in alone]
    assert together.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert together.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    twice = oai.completions.create(model="smol", prompt=prompts[:2], max_tokens=6, temperature=0, n=2,
                                   extra_body=fresh)
    assert [c.text for c in twice.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert twice.usage.prompt_tokens == alone[0].usage.prompt_tokens + alone[1].usage.prompt_tokens
    texts, usage = ["", "", ""], []
    for chunk in oai.completions.create(model="smol", prompt=prompts, max_tokens=6, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, extra_body=fresh):
        usage += [chunk.usage] if chunk.usage is not None else []
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in together.choices]
    assert len(usage) == 1 and usage[0].prompt_tokens == together.usage.prompt_tokens
    tokens = oai.completions.create(model="smol", prompt=[[1, 2, 3], [4, 5]], max_tokens=2, temperature=0)
    assert len(tokens.choices) == 2 and tokens.usage.prompt_tokens == 5


def test_json_schema_output_validates(oai):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = oai.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "A person as JSON."}],
        max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_tool_call_required(oai):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]
    r = oai.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                    tools=tools, tool_choice="required", max_tokens=60, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)


def test_logprobs(oai):
    r = oai.chat.completions.create(model="smol", messages=MSGS, max_tokens=4, temperature=0,
                                    logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.logprob == pytest.approx(max(t.logprob for t in item.top_logprobs))  # greedy


def test_models_and_health_are_public(server):
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    models = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "smol"
    assert models["data"][0]["aliases"] == ["smol"] and models["data"][0]["tags"] == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "nope"}])
def test_api_key_required(server, headers):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1},
                   headers=headers, timeout=10)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1},
                    headers={"X-Api-Key": API_KEY}, timeout=30)
    assert ok.status_code == 200


@pytest.mark.parametrize("body,status", [
    ("{not json", 400),
    ('{"messages": "hi"}', 400),
    ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}', 400),
    ('{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400),
    ('{"messages": [{"role": "user", "content": "x"}], "model": 9}', 400),
    ('{"messages": [{"role": "wizard", "content": "x"}]}', 400),
    ('{"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= ("}', 400),
])
def test_errors_have_openai_shape(server, body, status):
    with server.client() as c:
        r = c.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"]


def test_prompt_longer_than_the_slot_is_400(server):
    """llama-server's exceed_context_size_error, with the counts its WebUI shows."""
    long = "word " * 700  # > 512 cells of one slot
    with server.client() as c:
        n_prompt = len(c.post("/tokenize", json={"content": long}).json()["tokens"])
        for route, body in (("/v1/completions", {"prompt": long, "max_tokens": 4}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]}),
                            ("/completion", {"prompt": long, "n_predict": 4, "stream": True})):
            r = c.post(route, json=body)
            err = r.json()["error"]
            assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
            assert err["n_ctx"] == 512 and "exceeds the available context size" in err["message"]
            if route != "/v1/chat/completions":
                assert err["n_prompt_tokens"] == n_prompt


def test_llama_server_request_edges(server):
    """max_tokens -1 is "no limit" (llama-server's bound), a schema llguidance refuses is a
    400 on the completion routes too, a lone UTF-16 surrogate is refused before any work."""
    with server.client() as c:
        for route, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": -1, "stop": ["."]}),
                            ("/v1/chat/completions", {"messages": MSGS, "max_tokens": -1, "stop": ["."]}),
                            ("/completion", {"prompt": "Hi", "max_tokens": -1, "stop": ["."]})):
            assert c.post(route, json=dict(body, temperature=0)).status_code == 200, route
        assert c.post("/completion", json={"prompt": "Hi", "max_tokens": -2}).status_code == 400
        for route in ("/completion", "/v1/completions"):
            for schema in ({"type": "nonsense"}, {"type": "array", "uniqueItems": True}):
                r = c.post(route, json={"prompt": "hi", "max_tokens": 2, "json_schema": schema})
                assert r.status_code == 400 and "json_schema" in r.json()["error"]["message"], r.text
        raw = b'{"prompt": "abc\\ud800 def", "n_predict": 2}'
        r = c.post("/completion", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
        pair = b'{"prompt": "\\ud83c\\udf1f", "n_predict": 1}'   # a valid pair is text
        assert c.post("/completion", content=pair, headers={"Content-Type": "application/json"}).status_code == 200


def test_llama_server_completion_fields(server):
    """stopping_word names the stop string; every streamed chunk carries its token id and
    the count of tokens so far; /tokenize's pieces show control tokens' text."""
    with server.client() as c:
        body = {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0}
        full = c.post("/completion", json=dict(body, return_tokens=True)).json()
        stop = full["content"][len(full["content"]) // 2:][:2]
        cut = c.post("/completion", json=dict(body, stop=[stop])).json()
        assert cut["stop_type"] == "word" and cut["stopping_word"] == stop
        lines = [json.loads(line[6:]) for line in c.post("/completion", json=dict(body, stream=True)).text.splitlines()
                 if line.startswith("data: ")]
        partial = [chunk for chunk in lines if not chunk["stop"]]
        counts = [chunk["tokens_predicted"] for chunk in partial]
        assert counts == sorted(set(counts)) and len(partial) > 10
        assert [chunk["tokens"] for chunk in partial] == [[full["tokens"][n - 1]] for n in counts]
        pieces = c.post("/tokenize", json={"content": "<|im_start|>Hi", "with_pieces": True}).json()["tokens"]
        assert pieces[0]["piece"] == "<|im_start|>"


def test_max_tokens_capped_by_the_slot_context(server):
    with server.client() as c:
        r = c.post("/completion", json={"prompt": "Once upon a time", "n_predict": 100000,
                                        "temperature": 0, "stop": ["."]}).json()
    assert r["tokens_predicted"] <= server.state.n_ctx_slot - r["tokens_evaluated"]


def test_unknown_route_and_body_limit(server):
    with server.client() as c:
        assert c.get("/v1/nothing").json()["error"]["code"] == 404
        big = c.post("/v1/completions", content=b"x" * (server.config.body_limit + 1))
        assert big.status_code == 413


def test_tokenize_detokenize_apply_template_props(server):
    with server.client() as c:
        ids = c.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert c.post("/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"
        pieces = c.post("/tokenize", json={"content": "Hello", "with_pieces": True}).json()["tokens"]
        assert "".join(p["piece"] for p in pieces) == "Hello"
        assert c.post("/detokenize", json={"tokens": [10 ** 9]}).status_code == 400
        prompt = c.post("/apply-template", json={"messages": MSGS}).json()["prompt"]
        assert "Name three colors." in prompt
        refused = c.post("/props", json={})   # llama-server's answer without --props
        assert refused.status_code == 501 and "--props" in refused.json()["error"]["message"]
        props = c.get("/props").json()
        assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 512
        caps = props["chat_template_caps"]   # llama-server's keys; SmolLM2's template has no tools
        assert set(caps) == {"supports_string_content", "supports_typed_content", "supports_tools",
                             "supports_tool_calls", "supports_parallel_tool_calls", "supports_system_role",
                             "supports_preserve_reasoning", "supports_reasoning_effort", "supports_object_arguments"}
        assert caps["supports_system_role"] and caps["supports_string_content"] and not caps["supports_tools"]
        params = props["default_generation_settings"]["params"]   # llama-server's names
        assert params["temperature"] == 0.8 and params["top_k"] == 40 and params["mirostat"] == 0
        assert params["dry_sequence_breakers"] == ["\n", ":", "\"", "*"]
        assert params["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                                      "min_p", "xtc", "temperature"]


def test_metrics_counts_tokens(server):
    names = ["llamacpp:tokens_predicted_total", "llamacpp:n_decode_total",
             "llamacpp:sampling_seconds_total", "llamacpp:tokens_predicted_seconds_total"]
    with server.client() as c:
        before = [_metric(c.get("/metrics").text, n) for n in names]
        t0 = time.perf_counter()
        c.post("/completion", json={"prompt": "One, two,", "n_predict": 5, "temperature": 0})
        wall = time.perf_counter() - t0
        after = [_metric(c.get("/metrics").text, n) for n in names]
    tokens, decodes, sampling, predicting = (a - b for a, b in zip(after, before))
    assert tokens >= 4  # the 5th token is sampled, never decoded
    assert decodes >= 5  # the prompt, then one per decoded token
    # each decode is followed by the slots' sampling, outside the decode's own time
    assert 0 < sampling and 0 < predicting and sampling + predicting < wall


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_embeddings_not_served_without_the_flag(server):
    with server.client() as c:
        r = c.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
           "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


def test_timings_and_cached_tokens(server):
    """llama-server's nine timings on /completion and on the OpenAI answers (the last chunk
    of a stream), and the prompt tokens its cache served in the usage."""
    body = {"messages": MSGS, "max_tokens": 6, "temperature": 0, "id_slot": 1}
    with server.client() as c:
        first = c.post("/v1/chat/completions", json=body).json()
        again = c.post("/v1/chat/completions", json=body).json()
        for answer in (first, again):
            t = answer["timings"]
            assert set(t) == TIMINGS and t["predicted_n"] == answer["usage"]["completion_tokens"]
            assert t["prompt_n"] + t["cache_n"] == answer["usage"]["prompt_tokens"]
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == t["cache_n"]
        assert again["timings"]["cache_n"] == again["usage"]["prompt_tokens"] - 1   # its last token again
        lines = [json.loads(line[6:]) for line in c.post("/v1/chat/completions", json=dict(
            body, stream=True, stream_options={"include_usage": True})).text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]
        assert [("timings" in chunk) for chunk in lines] == [False] * (len(lines) - 1) + [True]
        assert lines[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == lines[-1]["timings"]["cache_n"]
        native = c.post("/completion", json={"prompt": "Hi", "n_predict": 3}).json()
        assert set(native["timings"]) == TIMINGS and native["timings"]["predicted_n"] == 3


def test_completions_and_embeddings_without_v1_are_llama_servers(server):
    """llama-server's routes: /completions is /completion's shape (content), /v1/completions
    OpenAI's (choices)."""
    body = {"prompt": "The capital of France is", "n_predict": 4, "max_tokens": 4, "temperature": 0}
    with server.client() as c:
        native = c.post("/completions", json=body).json()
        legacy = c.post("/completion", json=body).json()
        oai = c.post("/v1/completions", json=body).json()
    assert native["content"] == legacy["content"] == oai["choices"][0]["text"]
    assert "choices" not in native and "content" not in oai


def test_logit_bias_in_every_llama_server_form(server):
    """[[id, bias]], {"id": bias}, and a text in place of the id (each of its tokens biased);
    `false` bans. Each form here bans the greedy continuation's first token the same way."""
    body = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0, "return_tokens": True}
    with server.client() as c:
        plain = c.post("/completion", json=body).json()
        first = plain["tokens"][0]
        text = c.post("/detokenize", json={"tokens": [first]}).json()["content"]
        forms = [[[first, -100]], {str(first): -100}, [[text, False]], {text: -100}, [[first, "x"], [text, False]]]
        outs = [c.post("/completion", json=dict(body, logit_bias=f)).json() for f in forms]
        bad = c.post("/completion", json=dict(body, logit_bias="nope"))
    assert all(o["tokens"][0] != first for o in outs)
    assert len({tuple(o["tokens"]) for o in outs}) == 1
    assert bad.status_code == 400


def test_completion_prompts_in_every_llama_server_form(server):
    """llama-server's prompt forms on /completion: token ids, several prompts (an array of
    them: an array of answers), ids mixed with texts in one prompt, an object with
    `prompt_string`; multimodal data is refused."""
    text = "The capital of France is"
    body = {"n_predict": 4, "temperature": 0}
    with server.client() as c:
        tokens = c.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
        one = c.post("/completion", json=dict(body, prompt=tokens)).json()
        several = c.post("/completion", json=dict(body, prompt=[tokens, text, {"prompt_string": text}])).json()
        mixed = c.post("/completion", json=dict(body, prompt=[text])).json()
        split = c.post("/completion", json=dict(body, prompt=tokens[:3] + [c.post(
            "/detokenize", json={"tokens": tokens[3:]}).json()["content"]])).json()
        media = c.post("/completion", json=dict(body, prompt={"prompt_string": text, "multimodal_data": ["AA=="]}))
    assert isinstance(several, list) and [s["content"] for s in several] == [one["content"]] * 3
    assert mixed["content"] == one["content"]
    assert split["tokens_evaluated"] >= len(tokens) - 1 and isinstance(split["content"], str)
    assert media.status_code == 400 and "multimodal" in media.json()["error"]["message"].lower()


def test_several_prompts_streamed_with_their_index(server):
    """llama-server's /completion with several prompts and `stream`: each prompt's chunks come
    with its index, as they are made, and join into the same texts as the array's answers."""
    body = {"n_predict": 8, "temperature": 0, "prompt": ["The capital of France is", "Once upon a time"]}
    with server.client() as c:
        whole = c.post("/completion", json=body).json()
        with c.stream("POST", "/completion", json=dict(body, stream=True)) as r:
            assert r.status_code == 200
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    texts, stops = {0: "", 1: ""}, {0: 0, 1: 0}
    for chunk in chunks:
        texts[chunk["index"]] += chunk["content"]
        stops[chunk["index"]] += chunk["stop"]
    assert texts == {0: whole[0]["content"], 1: whole[1]["content"]} and stops == {0: 1, 1: 1}
