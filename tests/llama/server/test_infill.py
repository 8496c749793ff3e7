"""llama-server's /infill (llama/server/infill.py) against llama-server itself: on a tiny
FIM model (tests/tools/infill_vectors.py recorded llama-server's answers, plain and with
--spm-infill), the same prompt (its text with the special tokens, the prompt token count:
the repo-level FIM pattern, the prefix and suffix cut to the batch, the extra chunks) and
the same greedy tokens; and llama-server's errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.llama.server.conftest import running
from tests.tools.infill_vectors import CASES, N_BATCH, N_CTX, N_PREDICT, write_model

VECTORS = json.loads((Path(__file__).parent / "data" / "infill_llama_cpp.json").read_text())


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("fim"))


@pytest.mark.parametrize("order", ["psm", "spm"])
def test_infill_matches_llama_server(fim_model, order):
    with running(fim_model, parallel=1, ctx_size=N_CTX, batch_size=N_BATCH, ubatch_size=N_BATCH,
                 spm_infill=order == "spm") as s, s.client() as c:
        for case, want in zip(CASES, VECTORS[order]):
            r = c.post("/infill", json={**case, "n_predict": N_PREDICT, "temperature": 0,
                                        "return_tokens": True, "cache_prompt": False})
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["prompt"] == want["prompt"]
            assert got["tokens_evaluated"] == want["tokens_evaluated"]
            assert got["tokens"] == want["tokens"]
        # streamed, the same text (an /infill answers as /completion does)
        text = ""
        with c.stream("POST", "/infill", json={**CASES[0], "n_predict": N_PREDICT, "temperature": 0,
                                               "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    text += json.loads(line[6:])["content"]
        plain = c.post("/infill", json={**CASES[0], "n_predict": N_PREDICT, "temperature": 0}).json()
        assert text == plain["content"]


@pytest.mark.parametrize("body, message", [
    ({"input_suffix": "x"}, '"input_prefix" is required'),
    ({"input_prefix": "x"}, '"input_suffix" is required'),
    ({"input_prefix": "x", "input_suffix": "", "prompt": 3}, '"prompt" must be a string'),
    ({"input_prefix": {"a": 1}, "input_suffix": ""}, '"input_prefix" must be a string or an array'),
    ({"input_prefix": "", "input_suffix": "", "input_extra": {}}, '"input_extra" must be an array'),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}, 'must contain a "text"'),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "a", "filename": 1}]},
     '"filename" field must be a string'),
])
def test_bad_infill_requests_are_400s(fim_model, body, message):
    with running(fim_model, parallel=1, ctx_size=N_CTX, batch_size=N_BATCH, ubatch_size=N_BATCH) as s, \
            s.client() as c:
        r = c.post("/infill", json=body)
        assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_a_model_without_fim_tokens_is_a_501(server):
    """SmolLM2 has none of the FIM tokens: llama-server's message, naming the three."""
    with server.client() as c:
        r = c.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
        assert r.status_code == 501
        assert r.json()["error"]["message"] == ("Infill is not supported by this model: prefix token "
                                                "is missing. suffix token is missing. middle token is missing. ")
