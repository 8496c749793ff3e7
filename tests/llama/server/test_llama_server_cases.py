"""Cases of llama.cpp's own server suite (tools/server/tests/unit), the same requests and
assertions against `ggmlpy serve` on SmolLM2: chat templates (prefill, continuation,
`__verbose`, reasoning, today's date), CORS as llama-server spells it, /metrics and timings,
`ignore_eos`, embeddings of content parts, /rerank, and Vertex AI's /predict. The full
suite runs beside llama-server with tests/tools/llama_server_suite.py."""
from __future__ import annotations

import json
import re
import time
from datetime import date
from pathlib import Path

import httpx
import pytest

from llama.server.gcp import VertexRoutes, format_alias
from tests.llama.server.conftest import running

TEMPLATES = Path(__file__).parents[1] / "chat" / "templates"
BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
LLAMA31_TAIL = "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>" \
               "<|start_header_id|>assistant<|end_header_id|>\n\n"
DOCUMENTS = ["A machine is a physical system.", "Learning is acquiring knowledge.",
             "Machine learning is a field of study in artificial intelligence.", "Paris est une grande ville."]


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.fixture(scope="module")
def llama31(smollm2_path):
    with running(smollm2_path, parallel=2, ctx_size=1024, chat_template=template("meta-llama-Llama-3.1-8B-Instruct"),
                 verbose=True, metrics=True, cors_origins="localhost", alias="tinyllama-2") as s:
        yield s


@pytest.fixture(scope="module")
def r1(smollm2_path):
    with running(smollm2_path, parallel=2, ctx_size=1024, vertex=VertexRoutes.from_env({"AIP_MODE": "PREDICTION"}),
                 chat_template=template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")) as s:
        yield s


@pytest.fixture(scope="module")
def reranker(smollm2_path):
    with running(smollm2_path, ctx_size=1024, embedding=True, reranking=True, pooling="rank") as s:
        yield s


def post(server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120, **kw)


# --- chat templates -------------------------------------------------------------------------


@pytest.mark.parametrize("prefill, expected", [("Whill", "Whill"),
                                               ([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}],
                                                "Wh\n\nill")])
def test_assistant_prefill(llama31, prefill, expected):
    r = post(llama31, "/chat/completions", {"max_tokens": 8, "messages": BOOK + [
        {"role": "assistant", "content": prefill}]})
    assert r.status_code == 200
    assert r.json()["__verbose"]["prompt"].endswith(LLAMA31_TAIL + expected)


def test_continue_final_message(llama31):
    body = {"max_tokens": 8, "messages": BOOK + [{"role": "assistant", "content": "Whill"}]}
    r = post(llama31, "/chat/completions", {**body, "add_generation_prompt": False, "continue_final_message": True})
    assert r.status_code == 200 and r.json()["__verbose"]["prompt"].endswith(LLAMA31_TAIL + "Whill")
    named = post(llama31, "/chat/completions", {**body, "add_generation_prompt": False,
                                                "continue_final_message": "content"})
    assert named.status_code == 200 and named.json()["__verbose"]["prompt"].endswith(LLAMA31_TAIL + "Whill")
    bad = post(llama31, "/chat/completions", {**body, "add_generation_prompt": False, "continue_final_message": "x"})
    assert bad.status_code == 400 and "continue_final_message 'x'" in bad.json()["error"]["message"]
    both = post(llama31, "/chat/completions", {**body, "add_generation_prompt": True, "continue_final_message": True})
    assert both.status_code == 400
    two = post(llama31, "/chat/completions", {"messages": BOOK + [{"role": "assistant", "content": "a"}] * 2})
    assert two.status_code == 400 and "2 or more assistant" in two.json()["error"]["message"]


def test_verbose_is_asked_per_request(llama31):
    for verbose in (True, False):
        r = post(llama31, "/chat/completions", {"max_tokens": 2, "messages": BOOK, "verbose": verbose})
        assert r.status_code == 200 and ("__verbose" in r.json()) is verbose
    assert "Book" in r.json().get("__verbose", {"prompt": "Book"})["prompt"]


def test_add_generation_prompt_and_today(llama31):
    header = "<|start_header_id|>assistant<|end_header_id|>"
    for add in (True, False):
        prompt = post(llama31, "/apply-template", {"messages": BOOK, "add_generation_prompt": add}).json()["prompt"]
        assert (header in prompt) is add
        assert date.today().strftime("%d %b %Y") in prompt


def test_stream_deltas_are_never_empty(llama31):
    """The first delta is the role with null content; every content delta after it has text
    (the suite's stream reader asserts both); the last chunk carries usage and timings."""
    with httpx.stream("POST", llama31.url + "/v1/chat/completions", timeout=120, json={
            "max_tokens": 12, "messages": BOOK, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    for c in chunks[1:]:
        for choice in c["choices"]:
            assert choice["delta"].get("content") is None or len(choice["delta"]["content"]) > 0
    assert chunks[-1]["choices"] == [] and "usage" in chunks[-1] and "timings" in chunks[-1]


def test_reasoning_of_a_thinking_template(r1):
    prompt = post(r1, "/apply-template", {"messages": BOOK}).json()["prompt"]
    assert prompt.endswith("<｜Assistant｜><think>\n")
    off = post(r1, "/apply-template", {"messages": BOOK, "chat_template_kwargs": {"enable_thinking": False}})
    assert off.json()["prompt"].endswith("<think>\n</think>")
    bad = post(r1, "/apply-template", {"messages": BOOK, "chat_template_kwargs": {"enable_thinking": "no"}})
    assert bad.status_code == 400 and "enable_thinking" in bad.json()["error"]["message"]
    # SmolLM2 never closes the block it was put in: the whole reply is reasoning
    body = {"max_tokens": 8, "messages": BOOK, "temperature": 0}
    message = post(r1, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert message["content"] == "" and message["reasoning_content"]
    raw = post(r1, "/v1/chat/completions", {**body, "reasoning_format": "none"}).json()["choices"][0]["message"]
    # unsplit, the block the prompt opened is given back whole, its marker too (llama.cpp's parser does so)
    assert raw["content"].startswith("<think>\n") and "reasoning_content" not in raw
    assert raw["content"][len("<think>"):].strip() == message["reasoning_content"]


# --- CORS, metrics, sampling settings ------------------------------------------------------------


@pytest.mark.parametrize("origin, allowed", [("http://localhost:8080", True), ("http://[::1]", True),
                                             ("http://127.0.0.1:3000", True), ("http://localhost.evil.com", False)])
def test_cors_headers_spelled_as_llama_server(llama31, origin, allowed):
    r = httpx.options(llama31.url + "/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"})
    names = [k for k, _ in r.headers.raw]
    assert r.status_code == 200 and b"Access-Control-Allow-Credentials" in names
    assert (b"Access-Control-Allow-Origin" in names) is allowed
    if allowed:
        assert r.headers["Access-Control-Allow-Origin"] == origin


def test_metrics_count_what_the_timings_report(llama31):
    prompt = "the quick brown fox jumps over the lazy dog"
    sums = {"prompt_n": 0, "cache_n": 0, "predicted_n": 0}
    for n_predict in (1, 4, 16):
        timings = post(llama31, "/completion", {"prompt": prompt, "n_predict": n_predict, "id_slot": 0,
                                                "temperature": 0}).json()["timings"]
        for k in sums:
            sums[k] += timings[k]
        if n_predict == 1:
            assert timings["predicted_per_second"] == 0.0 and timings["predicted_per_token_ms"] == 0.0
        else:   # the first token costs no decode step
            assert timings["predicted_per_second"] == pytest.approx(1e3 / timings["predicted_ms"] * (n_predict - 1))
    r = httpx.get(llama31.url + "/metrics", timeout=30)
    assert int(r.headers["Process-Start-Time-Unix"]) > 0
    values = dict(re.findall(r"^(llamacpp:\S+) (\S+)$", r.text, re.M))
    types = dict(re.findall(r"^# TYPE (llamacpp:\S+) (\w+)$", r.text, re.M))
    assert sums["cache_n"] > 0
    assert float(values["llamacpp:prompt_tokens_cached_total"]) >= sums["cache_n"]
    assert float(values["llamacpp:tokens_predicted_total"]) >= sums["predicted_n"]
    for name in ("llamacpp:n_tokens_max", "llamacpp:spec_decode_num_drafts_total", "llamacpp:prompt_tokens_total"):
        assert types[name] == "counter" and name in values


def test_prompt_progress_carries_timings(llama31):
    with httpx.stream("POST", llama31.url + "/completion", timeout=120, json={
            "prompt": "the quick brown fox jumps over the lazy dog " * 8, "n_predict": 4, "stream": True,
            "timings_per_token": True, "return_progress": True, "cache_prompt": False}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress[0]["timings"]["prompt_n"] == 0 and progress[0]["timings"]["prompt_ms"] == 0.0
    times = [c["timings"]["prompt_ms"] for c in progress]
    assert times == sorted(times) and times[-1] > 0


def test_ignore_eos_lists_its_logit_bias(llama31):
    for ignore in (True, False):
        settings = post(llama31, "/completion", {"n_predict": 2, "prompt": "Once upon a time", "ignore_eos": ignore,
                                                 "temperature": 0}).json()["generation_settings"]
        assert (len(settings["logit_bias"]) > 0) is ignore
        assert all(entry["bias"] is None for entry in settings["logit_bias"])


# --- embeddings, rerank, Vertex AI ---------------------------------------------------------------


def test_rerank(reranker):
    for top_n, n in ((None, 4), (2, 2), (99, 4)):
        body = {"query": "Machine learning is", "documents": DOCUMENTS, **({"top_n": top_n} if top_n else {})}
        r = post(reranker, "/rerank", body)
        assert r.status_code == 200
        results = r.json()["results"]
        assert len(results) == n and sorted(x["index"] for x in results) == sorted({x["index"] for x in results})
        scores = [x["relevance_score"] for x in results]
        assert scores == sorted(scores, reverse=True)
        assert r.json()["usage"]["prompt_tokens"] == r.json()["usage"]["total_tokens"] > 0
    tei = post(reranker, "/rerank", {"query": "Machine learning is", "texts": DOCUMENTS, "top_n": 2,
                                     "return_text": True}).json()
    assert len(tei) == 2 and tei[0]["text"] == DOCUMENTS[tei[0]["index"]] and "score" in tei[0]
    for bad in ([], None, 123, [1, 2, 3]):
        r = post(reranker, "/rerank", {"query": "Machine learning is", "documents": bad})
        assert r.status_code == 400 and "error" in r.json()


def test_embeddings_of_content_parts(reranker):
    r = post(reranker, "/v1/embeddings", {"input": [
        "hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]})
    data = r.json()["data"]
    assert r.status_code == 200 and data[0]["embedding"] == data[1]["embedding"]
    bad = post(reranker, "/v1/embeddings", {"input": [{"content": [{"type": "image_url", "image_url": {}}]}]})
    assert bad.status_code == 400


def test_vertex_ai_predict(r1):
    assert VertexRoutes.from_env({}) is None
    assert VertexRoutes.from_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "p", "AIP_HEALTH_ROUTE": "/h"}) \
        == VertexRoutes("/p", "/h")
    assert format_alias("/v1/chat/completions") == "chatCompletions"
    assert format_alias("/apply-template") == "applyTemplate"
    r = post(r1, "/predict", {"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 4, "messages": BOOK, "stream": True},
        {"@requestFormat": "/apply-template", "messages": BOOK},
        {"@requestFormat": "nothing", "messages": BOOK},
        "not an object"]})
    assert r.status_code == 200
    chat, applied, unknown, bad = r.json()["predictions"]
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert applied["prompt"].endswith("<think>\n")
    assert "no handler registered for @requestFormat: nothing" in unknown["error"]["message"]
    assert "must be a JSON object" in bad["error"]["message"]
    assert post(r1, "/predict", {"instances": 3}).status_code == 400


# --- idle sleep ----------------------------------------------------------------------------------


def test_idle_sleep_and_wake(smollm2_path):
    """--sleep-idle-seconds: the model unloads when idle; /health, /props and /metrics answer
    without waking it (the metrics as they were, their throughput reported once); a request
    that needs the model wakes it and is answered."""
    # 2 s idle: long enough that a loaded machine still asks /props before it sleeps again
    with running(smollm2_path, ctx_size=512, metrics=True, sleep_idle_seconds=2.0) as s:
        assert post(s, "/completion", {"prompt": "Hello", "n_predict": 4}).status_code == 200
        deadline = time.monotonic() + 20
        while not httpx.get(s.url + "/props").json()["is_sleeping"]:
            assert time.monotonic() < deadline, "the server did not fall asleep"
            time.sleep(0.1)
        assert s.state.llm is None and httpx.get(s.url + "/health").status_code == 200
        first, second = (httpx.get(s.url + "/metrics").text for _ in range(2))
        rate = r"^llamacpp:predicted_tokens_seconds (\S+)$"
        assert float(re.search(rate, first, re.M)[1]) > 0 and float(re.search(rate, second, re.M)[1]) == 0
        assert "llamacpp:tokens_predicted_total 4.0" in second
        assert httpx.get(s.url + "/props").json()["is_sleeping"]
        assert post(s, "/tokenize", {"content": "Hello"}).json()["tokens"]
        assert not httpx.get(s.url + "/props").json()["is_sleeping"]
        assert float(re.search(rate, httpx.get(s.url + "/metrics").text, re.M)[1]) == 0


def test_reasoning_in_the_messages_and_responses_apis(r1):
    """A thinking template's reasoning as Anthropic's thinking block and the Responses API's
    reasoning item (llama-server's shapes), whole and streamed."""
    chat = {"max_tokens": 6, "messages": [{"role": "user", "content": "What is the best book"}], "temperature": 0}
    message = post(r1, "/v1/messages", {"model": "x", **chat}).json()
    thinking = message["content"][0]
    assert thinking["type"] == "thinking" and thinking["thinking"] and thinking["signature"] == ""
    with httpx.stream("POST", r1.url + "/v1/messages", json={"model": "x", "stream": True, **chat}, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    deltas = "".join(e["delta"].get("thinking", "") for e in events if e["type"] == "content_block_delta")
    assert starts[0] == "thinking" and deltas == thinking["thinking"]
    body = {"model": "x", "input": "What is the best book", "max_output_tokens": 6, "temperature": 0}
    output = post(r1, "/v1/responses", body).json()["output"]
    assert output[0]["type"] == "reasoning" and output[0]["content"][0]["text"] == thinking["thinking"]
    with httpx.stream("POST", r1.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    text = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert text == thinking["thinking"]
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["output"][0]["type"] == "reasoning"


def test_the_openai_client_reads_reasoning_content(r1):
    from openai import OpenAI
    client = OpenAI(base_url=r1.url + "/v1", api_key="none")
    chat = dict(model="x", max_tokens=6, temperature=0, messages=[{"role": "user", "content": "What is the best book"}])
    message = client.chat.completions.create(**chat).choices[0].message
    assert message.reasoning_content and message.content == ""
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                       for c in client.chat.completions.create(stream=True, **chat) if c.choices)
    assert streamed == message.reasoning_content
