"""llama.cpp's server suite for speculative decoding (tools/server/tests/unit/test_speculative.py)
against `ggmlpy serve`: a draft model (`-md`, draft-simple) and ngram-simple change how many
tokens one decode yields, never which tokens.

llama.cpp's suite drafts a stories15M MoE target with a q4_0 stories15M downloaded from the
web; here both are tiny random-weight files written with the same seed, the draft with one
layer of the target's two: it shares the target's embeddings, output and first layer, so it
agrees with the target part of the time (seed 1: about one drafted token in ten is accepted,
some drafts are, most are not). Its `spec_synth_rates` cases have no counterpart (ggmlpy has
no synthetic drafter).
"""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from llama.server import ServerConfig
from llama.speculative.kinds import spec_types
from tests.llama.server.conftest import RunningServer, free_port, running

SEED = 1
N_VOCAB = 320                       # the tiny models' vocabulary (ggmlpy.testing.models)
PROMPT = "I believe the meaning of life is"
LONG_PROMPT = " the" * 248          # 248 tokens of the tiny vocabulary (" the" is one): 8 short of 256
DRAFT = dict(spec_type=["draft-simple"], spec_draft_n_min=4, spec_draft_n_max=8)   # llama.cpp's preset
GREEDY = {"prompt": PROMPT, "temperature": 0.0, "top_k": 1, "n_predict": 16}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> SimpleNamespace:
    from ggmlpy.testing.models_archs import write_tiny_model

    d = tmp_path_factory.mktemp("speculative")
    return SimpleNamespace(
        target=write_tiny_model("llama", d / "target.gguf", n_layer=2, seed=SEED),
        draft=write_tiny_model("llama", d / "draft.gguf", n_layer=1, seed=SEED),
        # 80 more tokens: within llama.cpp's 128, so accepted, though the target lacks them
        wide=write_tiny_model("llama", d / "wide.gguf", n_layer=1, seed=SEED, n_vocab=N_VOCAB + 80),
        # 192 more: refused
        foreign=write_tiny_model("llama", d / "foreign.gguf", n_layer=1, seed=SEED, n_vocab=N_VOCAB + 192))


@pytest.fixture(scope="module")
def plain(tiny):
    """The target alone: what every drafted answer must equal."""
    with running(tiny.target, ctx_size=256) as s:
        yield s


@pytest.fixture(scope="module")
def drafted(tiny):
    """Two slots of 256 tokens, as the target alone has one: the draft model's context holds
    512, so only the scheduler keeps a draft within its slot's context."""
    with running(tiny.target, ctx_size=512, parallel=2, model_draft=str(tiny.draft), metrics=True, **DRAFT) as s:
        yield s


def post(server, body: dict, path: str = "/completion") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def completion(server, body: dict) -> dict:
    r = post(server, body)
    assert r.status_code == 200, r.text
    return r.json()


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    found = re.search(rf"^llamacpp:{name} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found[1])


@contextmanager
def reach(server):
    """The furthest position each decode of `server` reaches in its slot (a list that fills
    while the block runs)."""
    engine = server.state.scheduler.engine
    decode_mixed, reached = engine.decode_mixed, []

    def recording(items):
        reached.append(max(engine.n_past(seq_id) + len(tokens) for seq_id, tokens, _ in items))
        return decode_mixed(items)

    engine.decode_mixed = recording
    try:
        yield reached
    finally:
        del engine.decode_mixed


def load_error(path: Path, **options) -> str:
    """The load error /health reports for a server of these options."""
    s = RunningServer(ServerConfig(model=str(path), port=free_port(), threads=2, **options))
    try:
        with pytest.raises(RuntimeError) as e:
            s.start()
    finally:
        s.stop()
    return json.loads(str(e.value))["error"]["message"]


# --- the cases of llama.cpp's file ------------------------------------------------------------


def test_with_and_without_draft(plain, drafted):
    """The same sampled tokens (temperature 0.2, top-k 5, a seed) with and without the draft;
    only the drafted answer's timings count drafts, and part of the draft is accepted."""
    request = {"prompt": PROMPT, "temperature": 0.2, "top_k": 5, "seed": 4242, "n_predict": 16,
               "return_tokens": True}
    without, with_draft = completion(plain, request), completion(drafted, request)
    assert "draft_n" not in without["timings"] and "draft_n_accepted" not in without["timings"]
    assert with_draft["tokens"] == without["tokens"] and len(without["tokens"]) == 16
    assert 0 < with_draft["timings"]["draft_n_accepted"] < with_draft["timings"]["draft_n"]


def test_different_draft_min_draft_max(tiny, plain):
    """Greedy content is the same for every (n_min, n_max), and the target's own."""
    expected = completion(plain, GREEDY)["content"]
    assert expected
    for n_min, n_max in [(1, 2), (1, 4), (4, 8), (4, 12), (8, 16)]:
        with running(tiny.target, ctx_size=256, model_draft=str(tiny.draft), spec_type=["draft-simple"],
                     spec_draft_n_min=n_min, spec_draft_n_max=n_max) as s:
            res = completion(s, GREEDY)
        assert res["content"] == expected, (n_min, n_max)
        assert res["timings"]["draft_n"] > 0, (n_min, n_max)


def test_slot_ctx_not_exceeded(plain, drafted):
    """A prompt 8 tokens short of the slot's 256: the drafts shrink to what the context has
    left, no decode reaches past it, and the answer is the target's (generation stops at the
    context, as without a draft)."""
    assert len(post(drafted, {"content": LONG_PROMPT}, "/tokenize").json()["tokens"]) == 248
    n_ctx = drafted.state.n_ctx_slot
    assert n_ctx == 256
    request = {"prompt": LONG_PROMPT, "temperature": 0.0, "top_k": 1, "speculative.p_min": 0.0,
               "cache_prompt": False}
    with reach(drafted) as reached:
        res = completion(drafted, request)
    assert res["content"] and res["timings"]["draft_n"] > 0
    assert res["tokens_evaluated"] + res["tokens_predicted"] <= n_ctx
    assert reached and max(reached) <= n_ctx
    slot = httpx.get(drafted.url + "/slots").json()[res["id_slot"]]
    assert slot["n_ctx"] == n_ctx and slot["n_past"] <= n_ctx
    assert res["content"] == completion(plain, request)["content"]


def test_with_ctx_shift(tiny):
    """--context-shift: 256 tokens after a 248-token prompt in a 256-token slot, the target's
    own; no decode reaches past the slot (max_tokens no longer keeps the drafts within it:
    it is past the context), and the drafts go on after the shifts, from what they kept
    (before the first, the context leaves room for at most 21 drafted tokens)."""
    body = {"prompt": LONG_PROMPT, "temperature": 0.0, "top_k": 1, "n_predict": 256, "speculative.p_min": 0.0,
            "return_tokens": True}
    with running(tiny.target, ctx_size=512, parallel=2, context_shift=True, model_draft=str(tiny.draft),
                 **DRAFT) as s:
        with reach(s) as reached:
            res = completion(s, body)
    assert reached and max(reached) <= 256
    assert len(res["content"]) > 0
    assert res["tokens_predicted"] == 256
    assert res["truncated"] is True
    assert res["timings"]["draft_n"] > 64 and res["timings"]["draft_n_accepted"] > 0
    with running(tiny.target, ctx_size=256, context_shift=True) as s:
        assert res["tokens"] == completion(s, body)["tokens"]


@pytest.mark.parametrize("n_slots,n_requests", [(1, 2), (2, 2)])
def test_multi_requests_parallel(tiny, plain, n_slots, n_requests):
    """Concurrent requests on 1 or 2 drafting slots each get the target's greedy answer."""
    body = dict(GREEDY, n_predict=32)
    expected = completion(plain, body)["content"]
    with running(tiny.target, ctx_size=256 * n_slots, parallel=n_slots, model_draft=str(tiny.draft),
                 **DRAFT) as s:
        with ThreadPoolExecutor(n_requests) as pool:
            results = list(pool.map(lambda _: post(s, body), range(n_requests)))
    for res in results:
        assert res.status_code == 200, res.text
        assert res.json()["content"] == expected
        assert res.json()["timings"]["draft_n"] > 0


def test_grammar_with_draft(plain, drafted):
    """A grammar (and a JSON schema) constrains the sampled tokens, not the draft's: the
    drafted answer is the constrained one, as without a draft."""
    body = {"prompt": PROMPT, "temperature": 0.0, "seed": 4242, "n_predict": 6, "grammar": 'root ::= "a"{5,5}'}
    res = completion(drafted, body)
    assert res["content"] == "aaaaa" == completion(plain, body)["content"]
    assert res["timings"]["draft_n"] > 0
    body = {"prompt": PROMPT, "temperature": 0.0, "n_predict": 24, "json_schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}
    res = completion(drafted, body)
    assert res["content"].startswith('{') and res["content"] == completion(plain, body)["content"]


def test_ignore_eos_with_draft(plain, drafted):
    """llama.cpp's last synth case without its synthetic drafter: ignore_eos runs to n_predict."""
    body = {"prompt": "Respond with only: OK", "temperature": 0.0, "seed": 4242, "n_predict": 64,
            "ignore_eos": True, "return_tokens": True}
    res = completion(drafted, body)
    assert res["tokens_predicted"] == 64 and res["stop_type"] == "limit"
    assert res["tokens"] == completion(plain, body)["tokens"]


# --- ggmlpy's own: the counters, the options, the vocabulary check ---------------------------


def test_metrics_and_slots_count_the_drafts(plain, drafted):
    """/metrics' spec_decode counters add up the answers' draft_n and draft_n_accepted;
    /slots says which server drafts."""
    names = ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
             "spec_decode_num_drafts_total")
    before = [metric(drafted, n) for n in names]
    answers = [completion(drafted, {"prompt": p, "temperature": 0.2, "top_k": 5, "seed": 7, "n_predict": 16})
               for p in (PROMPT, "Once upon a time", "the the the")]
    after = [metric(drafted, n) for n in names]
    drafted_n = sum(a["timings"]["draft_n"] for a in answers)
    accepted = sum(a["timings"]["draft_n_accepted"] for a in answers)
    assert after[0] - before[0] == drafted_n > 0
    assert after[1] - before[1] == accepted
    assert after[2] - before[2] > 0
    assert all(s["speculative"] is True for s in httpx.get(drafted.url + "/slots").json())
    assert all(s["speculative"] is False for s in httpx.get(plain.url + "/slots").json())


def test_spec_types():
    """--spec-type: llama.cpp's order of preference, `none` turning it off, -md implying
    draft-simple (draft-mtp for a gemma4-assistant); its types ggmlpy lacks and unknown ones
    refused by name."""
    assert spec_types([], None) == []
    assert spec_types([], "d.gguf") == ["draft-simple"]
    assert spec_types(["draft-simple", "ngram-simple"], "d.gguf") == ["ngram-simple", "draft-simple"]
    assert spec_types(["ngram-simple", "none"], None) == []
    assert spec_types([], "a.gguf", "gemma4-assistant") == ["draft-mtp"]
    assert spec_types(["draft-mtp", "ngram-simple"], "a.gguf") == ["ngram-simple", "draft-mtp"]
    with pytest.raises(ValueError, match="--spec-type draft-eagle3: ggmlpy implements none, ngram-simple, "
                                         "draft-simple, draft-mtp"):
        spec_types(["draft-eagle3"], None)
    with pytest.raises(ValueError, match="draft-simple and draft-mtp use the one draft model"):
        spec_types(["draft-mtp", "draft-simple"], "a.gguf")
    with pytest.raises(ValueError, match="unknown speculative type: bogus"):
        spec_types(["bogus"], None)
    with pytest.raises(ValueError, match=r"draft-simple needs a draft model \(-md FILE\)"):
        spec_types(["draft-simple"], None)


def test_load_errors(tiny):
    """A server whose speculative options cannot work says why on /health."""
    assert "--spec-type draft-eagle3: ggmlpy implements" in load_error(tiny.target, spec_type=["draft-eagle3"])
    assert "draft-mtp needs a draft model" in load_error(tiny.target, spec_type=["draft-mtp"])
    assert "draft-simple needs a draft model" in load_error(tiny.target, spec_type=["draft-simple"])
    message = load_error(tiny.target, model_draft=str(tiny.foreign))
    assert "vocabulary does not match" in message and f"{N_VOCAB + 192} tokens, the target's {N_VOCAB}" in message


def test_draft_with_more_tokens_than_the_target(tiny, plain):
    """A draft with 80 tokens the target lacks passes the vocabulary check; it drafts among
    the target's tokens only (one it lacks failed the target's decode: a 500)."""
    request = {"prompt": PROMPT, "temperature": 0.2, "top_k": 5, "seed": 4242, "n_predict": 32,
               "return_tokens": True}
    with running(tiny.target, ctx_size=256, model_draft=str(tiny.wide), **DRAFT) as s:
        res = completion(s, request)
    assert res["timings"]["draft_n"] > 0
    assert res["tokens"] == completion(plain, request)["tokens"]


def test_ngram_simple_on_smollm2(smollm2_path, server):
    """ngram-simple drafts what followed the last 3 tokens earlier in a repetitive prompt:
    drafts are accepted and the tokens are those of the session's server without them."""
    body = {"prompt": "a b c d e f g h a b c d e f g h a b c d e f g h a b c", "temperature": 0.0,
            "n_predict": 32, "return_tokens": True, "cache_prompt": False}
    with server.client() as c:
        r = c.post("/completion", json=body)
        assert r.status_code == 200, r.text
        expected = r.json()["tokens"]
    with running(smollm2_path, ctx_size=512, spec_type=["ngram-simple"], spec_ngram_size_n=3,
                 spec_ngram_size_m=8) as s:
        res = completion(s, body)
    assert res["timings"]["draft_n_accepted"] > 0
    assert res["tokens"] == expected
