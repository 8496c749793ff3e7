"""bench/bench_server.py's own parts against a real server: its stdlib client reads every
streamed token (the rates it reports count them), and its /metrics split adds up."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx


def _bench_server():
    path = Path(__file__).resolve().parents[3] / "bench" / "bench_server.py"
    spec = importlib.util.spec_from_file_location("bench_server", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_client_sees_every_token_and_split_counts_decodes(smollm2_path):
    from tests.llama.server.conftest import running

    bs = _bench_server()
    with running(smollm2_path, parallel=2, ctx_size=1024, metrics=True) as server:
        before = bs.counters(server.url)
        load = bs.run_load(server.url, 2, 12, 1)
        after = bs.counters(server.url)
        stream = bs.one_stream(server.url, 12, seed=3)
        # the same request with httpx, not streamed: as many tokens as the stream's chunks
        body = {"messages": bs.PROMPT, "max_tokens": 12, "ignore_eos": True,
                "temperature": 0.8, "seed": 3, "cache_prompt": False, "logprobs": True}
        whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert load["failed"] == 0 and load["requests"] == 2 and load["itl_p50_ms"] > 0
    assert after["tokens_predicted"] - before["tokens_predicted"] >= 2 * 11
    pieces = [t["token"] for t in whole["choices"][0]["logprobs"]["content"]]
    assert len(pieces) == 12
    assert len(stream["itl"]) + 1 == sum(1 for p in pieces if p)  # a chunk per token with text
    split = bs.per_decode(before, after)
    decodes = after["n_decode"] - before["n_decode"]
    assert decodes >= 12  # one prompt step, then a step per generated token for both
    assert 0 < split["sampling_ms"] < split["decode_ms"]
    assert bs.per_decode({}, {"n_decode": 1.0}) == {}  # llama-server has no sampling_seconds
