"""Continuous batching: concurrent greedy requests give the tokens each gives alone, a
request joining mid-generation changes nothing, shared prefixes are stored once."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from llama.server.slots import base_cells

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a fox",
           "The three primary colors are"]


def _complete(server, prompt: str, n: int = 16, **extra) -> list[int]:
    with server.client() as c:
        r = c.post("/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0,
                                        "cache_prompt": False, "return_tokens": True, **extra})
        r.raise_for_status()
        return r.json()["tokens"]


def test_concurrent_greedy_requests_match_each_alone(server):
    alone = [_complete(server, p) for p in PROMPTS]
    with ThreadPoolExecutor(4) as ex:
        together = list(ex.map(lambda p: _complete(server, p), PROMPTS))
    assert together == alone
    assert all(len(t) == 16 for t in alone)


def test_joining_mid_generation_changes_no_tokens(server):
    alone = _complete(server, PROMPTS[0], 40)
    with ThreadPoolExecutor(2) as ex:
        first = ex.submit(_complete, server, PROMPTS[0], 40)
        time.sleep(0.3)  # the first is generating when the second's prompt arrives
        second = ex.submit(_complete, server, PROMPTS[1], 8)
        assert first.result(timeout=60) == alone
        assert len(second.result(timeout=60)) == 8


def test_shared_system_prompt_is_stored_once(server):
    system = ("You are a helpful assistant who answers briefly and politely, "
              "always in English, and never uses more than one sentence. ") * 3
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
             for q in ("What is 2+2?", "Name a fruit.")]
    with server.client() as c:
        c.post("/slots/0?action=erase")  # the slots start empty, so sharing is what is measured
        for sid in range(4):
            c.post(f"/slots/{sid}?action=erase")
        n_sys = len(c.post("/tokenize", json={"content": system}).json()["tokens"])
        c.post("/v1/chat/completions", json={"messages": chats[0], "max_tokens": 2, "id_slot": 0,
                                              "temperature": 0}).raise_for_status()
        c.post("/v1/chat/completions", json={"messages": chats[1], "max_tokens": 2, "id_slot": 1,
                                              "temperature": 0}).raise_for_status()
        slots = c.get("/slots").json()
    cells = base_cells(server.state.scheduler.engine)
    shared = int(np.count_nonzero(cells.seq.sum(axis=1) > 1))
    total_tokens = sum(s["n_past"] for s in slots)
    assert shared >= n_sys  # the system prompt (and the template around it) once
    assert cells.used == total_tokens - shared  # every shared cell counted once
    assert sorted(s["n_shared_cells"] for s in slots)[-2:] == [shared, shared]


def test_context_shift(smollm2_path):
    """--context-shift: a generation past its slot's context drops half of what is not kept
    and goes on (llama-server's rule), where it would otherwise stop at the context; until
    the first shift both give the same greedy tokens."""
    from tests.llama.server.conftest import running

    body = {"prompt": "Once upon a time", "n_predict": 300, "temperature": 0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": False}
    with running(smollm2_path, parallel=1, ctx_size=256) as plain:
        with plain.client() as c:
            n_ctx = c.get("/props").json()["default_generation_settings"]["n_ctx"]
            stopped = c.post("/completion", json=body).json()
    with running(smollm2_path, parallel=1, ctx_size=256, context_shift=True) as shifting:
        with shifting.client() as c:
            shifted = c.post("/completion", json=body).json()
            kept = c.post("/completion", json=dict(body, n_keep=-1, n_discard=20, n_predict=320)).json()
            assert c.post("/completion", json=dict(body, n_keep=-2)).status_code == 400
            assert c.get("/health").status_code == 200
    n_prompt = stopped["tokens_evaluated"]
    assert stopped["truncated"] is False and stopped["tokens_predicted"] == n_ctx - n_prompt < 300
    assert shifted["truncated"] is True and shifted["tokens_predicted"] == 300
    assert shifted["tokens"][:len(stopped["tokens"])] == stopped["tokens"]
    assert kept["truncated"] is True and kept["tokens_predicted"] == 320


def test_prompt_progress_is_streamed(smollm2_path):
    """return_progress: while a long prompt decodes in chunks of n_batch, its stream gets
    llama-server's prompt_progress (processed counting up to total, the cache included),
    then the tokens; the OpenAI streams carry them in chunks without choices."""
    import json

    from tests.llama.server.conftest import running

    prompt = "The quick brown fox jumps over the lazy dog. " * 30
    with running(smollm2_path, parallel=1, ctx_size=1024, batch_size=64) as server:
        with server.client() as c:
            body = {"prompt": prompt, "n_predict": 4, "stream": True, "return_progress": True,
                    "cache_prompt": False}
            lines = [json.loads(line[6:]) for line in c.post("/completion", json=body).text.splitlines()
                     if line.startswith("data: ")]
            chat = [json.loads(line[6:]) for line in c.post("/v1/completions", json={
                "prompt": prompt, "max_tokens": 4, "stream": True, "return_progress": True,
                "cache_prompt": False}).text.splitlines() if line.startswith("data: {")]
            quiet = c.post("/completion", json=dict(body, return_progress=False)).text
    progress = [chunk["prompt_progress"] for chunk in lines if "prompt_progress" in chunk]
    total = lines[-1]["tokens_evaluated"]
    assert len(progress) >= total // 64 + 1 and all(p["total"] == total for p in progress)
    done = [p["processed"] for p in progress]
    assert done == sorted(done) and done[0] == 0 and done[-1] == total
    first_text = next(i for i, chunk in enumerate(lines) if chunk.get("content"))
    assert all("prompt_progress" in chunk for chunk in lines[:first_text])
    oai = [chunk for chunk in chat if "prompt_progress" in chunk]
    assert len(oai) == len(progress) and all(chunk["choices"] == [] for chunk in oai)
    assert chat[-1]["choices"][0]["finish_reason"] == "length"
    assert "prompt_progress" not in quiet
