"""llama-server's context checkpoints on a hybrid model (the tiny qwen35 file): a recurrent
state cannot drop tokens, so a follow-up prompt that shares only a prefix of the slot's
cached text resumes from the checkpoint taken 4 tokens before the end of the earlier
prompt, evaluates only the tokens after it, and gives the tokens a fresh decode gives."""
from __future__ import annotations

import pytest

from ggmlpy.testing.models_archs import write_tiny_model
from tests.llama.server.conftest import running

N = 6
FIRST = [(7 * i + 3) % 300 + 10 for i in range(40)]


@pytest.fixture(scope="module")
def hybrid_server(tmp_path_factory):
    path = write_tiny_model("qwen35", tmp_path_factory.mktemp("ckpt") / "qwen35.gguf")
    with running(path, parallel=1, ctx_size=256, ctx_checkpoints=4) as s:
        yield s


def _complete(c, prompt: list[int], **extra) -> dict:
    r = c.post("/completion", json={"prompt": prompt, "n_predict": N, "temperature": 0, "return_tokens": True,
                                    "id_slot": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_follow_up_resumes_from_the_checkpoint(hybrid_server):
    with hybrid_server.client() as c:
        first = _complete(c, FIRST)
        follow = FIRST + [200, 201, 202, 203, 204]            # not what the slot generated
        assert follow[len(FIRST):] != first["tokens"][:5]
        fresh = _complete(c, follow, cache_prompt=False)
        _complete(c, FIRST)                                  # the slot holds FIRST and its reply again
        resumed = _complete(c, follow)
        assert resumed["tokens_cached"] == len(FIRST) - 4    # the checkpoint 4 tokens before its end
        assert resumed["timings"]["prompt_n"] == len(follow) - (len(FIRST) - 4)
        assert resumed["tokens"] == fresh["tokens"]


def test_a_prompt_that_extends_the_cache_needs_no_checkpoint(hybrid_server):
    with hybrid_server.client() as c:
        first = _complete(c, FIRST)
        cached = FIRST + first["tokens"][:-1]                # the last token was sampled, not decoded
        more = cached + [150, 151]
        out = _complete(c, more)
        assert out["tokens_cached"] == len(cached)
        assert out["timings"]["prompt_n"] == 2
        assert out["tokens"] == _complete(c, more, cache_prompt=False)["tokens"]


def test_without_checkpoints_the_prompt_is_decoded_again(tmp_path):
    path = write_tiny_model("qwen35", tmp_path / "qwen35.gguf")
    with running(path, parallel=1, ctx_size=256, ctx_checkpoints=0) as s, s.client() as c:
        _complete(c, FIRST)
        out = _complete(c, FIRST + [200, 201])
        assert out["tokens_cached"] == 0 and out["timings"]["prompt_n"] == len(FIRST) + 2
