"""llama-server's `n_indent` through the server: the greedy text without it, cut where the
first line after the first is indented less (tests/llama/api/test_text_stream.py's reference),
streamed or not, with llama-server's stop type `limit`."""
from __future__ import annotations

import json

import pytest

from tests.llama.api.test_text_stream import _indent_reference

PROMPT = "def fibonacci(n):"
N = 48


def _stream_text(c, body: dict) -> str:
    text = ""
    with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                text += json.loads(line[6:])["content"]
    return text


def test_n_indent_cuts_the_first_short_line(server):
    with server.client() as c:
        body = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "cache_prompt": False}
        full = c.post("/completion", json=body).json()["content"]
        cuts = 0
        for n_indent in (4, 8):
            cut = _indent_reference(full.encode(), n_indent)
            want = full if cut is None else full.encode()[:cut].decode()
            got = c.post("/completion", json={**body, "n_indent": n_indent}).json()
            assert got["content"] == want
            assert got["generation_settings"]["n_indent"] == n_indent
            if cut is not None:
                cuts += 1
                assert got["stop_type"] == "limit" and got["stop"] is True
            assert _stream_text(c, {**body, "n_indent": n_indent}) == want
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                                "n_indent": n_indent})
            choice = r.json()["choices"][0]
            assert choice["text"] == want
            assert choice["finish_reason"] == ("length" if cut is not None else choice["finish_reason"])
        assert cuts >= 1   # the check bites for this prompt
        r = c.post("/completion", json={**body, "n_indent": "4"})
        assert r.status_code == 400 and "'n_indent' must be an integer" in r.json()["error"]["message"]
