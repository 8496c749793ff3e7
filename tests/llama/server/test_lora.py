"""LoRA adapters in the server: `--lora`/`--lora-scaled`/`--lora-init-without-apply`,
`GET`/`POST /lora-adapters` and the request field `lora`, with llama-server's shapes.

The expected tokens come from the engine itself (a Context with the adapter at that
scale, tests/llama/models/test_lora.py checks those against llama.cpp); here: that every route
reaches them, that slots with different adapters decode side by side without changing
each other's tokens, and that no slot reuses a prefix cached under other scales.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import llama
from ggmlpy.cli import build_parser
from ggmlpy.cli.serve_cmd import config_from_args
from tests.llama.server.conftest import running
from tests.tools.lora_vectors import write_adapter

PROMPT = "In 1492,"
N = 12


@pytest.fixture(scope="module")
def adapter_path(tmp_path_factory):
    return write_adapter(tmp_path_factory.mktemp("server-lora"))


@pytest.fixture(scope="module")
def expected(smollm2_path, adapter_path):
    """The greedy tokens of PROMPT at each scale, from a Context."""
    model = llama.Model.load(smollm2_path)
    adapter = model.load_lora(adapter_path)
    prompt = model.tokenize(PROMPT)
    out = {}
    for scale in (0.0, 0.5, 1.0):
        ctx = llama.Context(model, n_ctx=512)
        if scale:
            ctx.set_adapter_lora(adapter, scale)
        assert ctx.decode(llama.Batch.from_tokens(prompt)) == 0
        toks = []
        for _ in range(N):
            toks.append(int(np.argmax(ctx.get_logits_ith(-1))))
            assert ctx.decode(llama.Batch.from_tokens([toks[-1]])) == 0
        out[scale] = toks
    model.close()
    assert out[0.0] != out[1.0] and out[0.5] != out[1.0]   # the scales matter for this prompt
    return out


@pytest.fixture(scope="module")
def server(smollm2_path, adapter_path):
    with running(smollm2_path, parallel=2, ctx_size=1024, lora=[(str(adapter_path), 1.0)]) as s:
        yield s


def complete(client, **extra) -> dict:
    r = client.post("/completion", json={"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                         "return_tokens": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_lora_adapters_endpoint_and_scales(server, adapter_path, expected):
    with server.client() as c:
        assert c.get("/lora-adapters").json() == [
            {"id": 0, "path": str(adapter_path), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]
        assert complete(c)["tokens"] == expected[1.0]                              # --lora's 1.0
        assert complete(c, lora=[{"id": 0, "scale": 0.5}])["tokens"] == expected[0.5]
        assert complete(c, lora=[])["tokens"] == expected[0.0]                     # left out: 0
        answer = complete(c, lora=[{"id": 0, "scale": 0.5}])
        assert answer["generation_settings"]["lora"] == [{"id": 0, "scale": 0.5}]
        # the OpenAI endpoints take the field too
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                            "lora": [{"id": 0, "scale": 0.5}]})
        assert r.json()["choices"][0]["text"] == server.state.llm.model.detokenize(expected[0.5])
        # POST sets the server's scales for the requests after it (left out: 0)
        assert c.post("/lora-adapters", json=[]).json() == {"success": True}
        assert c.get("/lora-adapters").json()[0]["scale"] == 0.0
        assert complete(c)["tokens"] == expected[0.0]
        assert c.get("/props").json()["default_generation_settings"]["params"]["lora"] == [
            {"id": 0, "scale": 0.0}]
        assert c.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]).status_code == 200
        assert complete(c)["tokens"] == expected[1.0]


def test_no_prefix_is_reused_across_scales(server, expected):
    """The same prompt in the same slot, at another scale: nothing of the adapted cache is
    reused (the tokens are the other scale's); at the same scale it is.

    The first request decodes its whole prompt (cache_prompt off: no cells shared in from
    another slot), so its cells lie as the fixture's context's do. Cells shared in from
    another slot would lie elsewhere in the cache, which changes the attention's summation
    order: bits apart that SmolLM2's 8-bit activations can grow into a flipped near-tie
    (seen on an AVX2 host), so such a reuse is compared with itself, not with a fresh decode."""
    with server.client() as c:
        first = complete(c, id_slot=0, lora=[{"id": 0, "scale": 1.0}], cache_prompt=False)
        assert first["tokens_cached"] == 0 and first["tokens"] == expected[1.0]
        again = complete(c, id_slot=0, lora=[{"id": 0, "scale": 1.0}])
        assert again["tokens_cached"] > 0 and again["tokens"] == first["tokens"]
        other = complete(c, id_slot=0, lora=[{"id": 0, "scale": 0.0}])
        assert other["tokens_cached"] == 0 and other["tokens"] == expected[0.0]
        slots = c.get("/slots").json()
        assert slots[0]["lora"] == [{"id": 0, "scale": 0.0}]


def test_slots_with_different_scales_decode_together(server, expected):
    """Two streams at once, one adapted and one plain, each in its own slot of the same
    decode steps (llama-server would batch them apart): each gets its tokens alone."""
    results = {}

    def run(scale: float) -> None:
        with server.client() as c:
            results[scale] = complete(c, lora=[{"id": 0, "scale": scale}], cache_prompt=False)
    threads = [threading.Thread(target=run, args=(s,)) for s in (1.0, 0.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results[1.0]["tokens"] == expected[1.0]
    assert results[0.0]["tokens"] == expected[0.0]
    assert results[1.0]["id_slot"] != results[0.0]["id_slot"]


@pytest.mark.parametrize("body, message", [
    ({"lora": {"id": 0}}, "'lora' must be an array"),
    ({"lora": [0]}, "'lora[0]' must be an object"),
    ({"lora": [{"id": 1, "scale": 1.0}]}, "'lora[0].id' 1 is not a loaded LoRA adapter"),
    ({"lora": [{"id": "0", "scale": 1.0}]}, "'lora[0].id' must be an integer"),
    ({"lora": [{"id": 0, "scale": "big"}]}, "'lora[0].scale' must be a finite number"),
])
def test_bad_lora_fields_are_400s(server, body, message):
    with server.client() as c:
        r = c.post("/completion", json={"prompt": "hi", "n_predict": 1, **body})
        assert r.status_code == 400 and message in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 1, **body})
        assert r.status_code == 400 and message in r.json()["error"]["message"]
        r = c.post("/lora-adapters", json={"id": 0})
        assert r.status_code == 400 and "Request body must be an array" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 200


def test_init_without_apply(smollm2_path, adapter_path, expected):
    with running(smollm2_path, parallel=1, ctx_size=512, lora=[(str(adapter_path), 1.0)],
                 lora_init_without_apply=True) as s, s.client() as c:
        assert c.get("/lora-adapters").json()[0]["scale"] == 0.0
        assert complete(c)["tokens"] == expected[0.0]
        assert complete(c, lora=[{"id": 0, "scale": 1.0}])["tokens"] == expected[1.0]


def test_lora_flags():
    args = build_parser().parse_args(["serve", "-m", "m.gguf", "--lora", "a.gguf,b.gguf",
                                      "--lora-scaled", "c.gguf:0.5", "--lora", "d.gguf",
                                      "--lora-init-without-apply"])
    cfg = config_from_args(args)
    assert cfg.lora == [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 0.5), ("d.gguf", 1.0)]
    assert cfg.lora_init_without_apply
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "-m", "m.gguf", "--lora-scaled", "c.gguf"])
