"""Pre-tokenizers without a vocabulary test file in llama.cpp's models/ (Kimi K2's), against
llama.cpp on the same file: tests/tools/pre_split_vectors.py writes a vocabulary whose merges
join every adjacent byte pair of the texts, so the tokens show where each text was cut, and
records llama.cpp's tokens for them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggmlpy.testing.models import write_pair_vocab
from llama import Llama
from tests.tools.pre_split_vectors import CASES

DATA = json.loads((Path(__file__).parent / "data" / "pre_split.json").read_text())


@pytest.mark.parametrize("pre", sorted(CASES))
def test_tokens_match_llama_cpp(tmp_path, pre):
    assert [c["text"] for c in DATA[pre]] == CASES[pre], "rerun tests/tools/pre_split_vectors.py"
    llm = Llama(str(write_pair_vocab(tmp_path / f"{pre}.gguf", pre, CASES[pre])), vocab_only=True, verbose=False)
    for case in DATA[pre]:
        assert llm.tokenize(case["text"].encode(), add_bos=False, special=False) == case["tokens"], case["text"]


def test_the_vocabulary_shows_the_cuts(tmp_path):
    """The same text cut elsewhere gives other tokens: a pre-tokenizer that keeps Han and
    Latin letters together (qwen2's) does not give Kimi K2's."""
    texts = CASES["kimi-k2"]
    kimi = Llama(str(write_pair_vocab(tmp_path / "k.gguf", "kimi-k2", texts)), vocab_only=True, verbose=False)
    qwen = Llama(str(write_pair_vocab(tmp_path / "q.gguf", "qwen2", texts)), vocab_only=True, verbose=False)
    differ = [t for t in texts if kimi.tokenize(t.encode(), add_bos=False) != qwen.tokenize(t.encode(), add_bos=False)]
    assert len(differ) >= 5, differ
