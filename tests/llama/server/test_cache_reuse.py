"""llama-server's cache reuse (`--cache-reuse N`, the request field `n_cache_reuse`): a
prompt that drops a passage from the middle of the slot's cached one gets the cached text
after it moved into place (KV shift) instead of decoded again. As in llama-server that text
keeps what it computed with the passage in front of it, so the generation may differ from
a fresh decode's; tests/llama/api/test_engine.py checks the moves against llama-server's calls."""
from __future__ import annotations

from llama.api.engine import common_prefix

HEAD = "The history of bridges in Europe begins with the Romans, who built stone arches."
MIDDLE = " A recipe for pasta needs flour, eggs, salt and a little olive oil, kneaded well."
TAIL = (" Medieval builders kept the arch but added pointed forms, and the industrial age"
        " brought iron, then steel, and finally the long suspension spans of today. The")
N = 8


def test_cache_reuse_moves_the_cached_tail_into_place(server):
    with server.client() as c:
        def tokens(text: str) -> list[int]:
            return c.post("/tokenize", json={"content": text}).json()["tokens"]

        def complete(prompt: str, **extra) -> dict:
            r = c.post("/completion", json={"prompt": prompt, "n_predict": N, "temperature": 0,
                                            "return_tokens": True, "id_slot": 3, **extra})
            assert r.status_code == 200, r.text
            return r.json()

        full, short = tokens(HEAD + MIDDLE + TAIL), tokens(HEAD + TAIL)
        prefix = common_prefix(full, short)
        fresh = complete(HEAD + TAIL, cache_prompt=False)
        assert fresh["tokens_cached"] == 0

        complete(HEAD + MIDDLE + TAIL)                      # the slot caches the long prompt
        plain = complete(HEAD + TAIL)                       # no reuse: only the common prefix
        assert plain["tokens_cached"] == prefix

        complete(HEAD + MIDDLE + TAIL)
        reused = complete(HEAD + TAIL, n_cache_reuse=8)
        # the tail (all but the prompt's last token, decoded again for its logits) moved
        assert reused["tokens_cached"] == len(short) - 1 > prefix + 8
        assert plain["tokens"] == fresh["tokens"]
        assert reused["timings"]["prompt_n"] == 1

        complete(HEAD + MIDDLE + TAIL)                      # a chunk shorter than asked: kept out
        assert complete(HEAD + TAIL, n_cache_reuse=1000)["tokens_cached"] == prefix
        # the slot now holds the short prompt: the same prompt again reuses all of it
        again = complete(HEAD + TAIL)
        assert again["tokens_cached"] == len(short) - 1 and again["tokens"] == fresh["tokens"]
        # --cache-reuse is the field's default
        assert server.config.cache_reuse == 0
