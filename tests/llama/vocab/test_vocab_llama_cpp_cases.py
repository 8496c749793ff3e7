"""llama.cpp's own tokenizer cases (its tests/test-tokenizer-0 over models/ggml-vocab-*.gguf
with their .inp/.out files), for the vocabularies kept in data/: the Qwen3.5 vocabulary
(pre-tokenizer `qwen35`, 248k tokens; the file xz-compressed). Every case's tokens, without
special tokens added, as llama.cpp's test."""
from __future__ import annotations

import lzma
from pathlib import Path

import pytest

import llama

DATA = Path(__file__).parent / "data"
SEP = "\n__ggml_vocab_test__\n"


def _cases(name: str) -> list[tuple[str, list[int]]]:
    """The .inp texts (split as test-tokenizer-0 splits them) with the .out token lists."""
    raw = (DATA / f"{name}.inp").read_text(encoding="utf-8")
    texts = raw.split(SEP)
    if texts and texts[-1] == "":
        texts.pop()   # the file ends with a separator
    outs = (DATA / f"{name}.out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(outs), f"{name}: {len(texts)} inputs, {len(outs)} outputs"
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


@pytest.fixture(scope="module")
def qwen35_vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "ggml-vocab-qwen35.gguf"
    path.write_bytes(lzma.decompress((DATA / "ggml-vocab-qwen35.gguf.xz").read_bytes()))
    model = llama.Model.load(str(path), vocab_only=True)
    assert model.gguf.metadata["tokenizer.ggml.pre"] == "qwen35"
    return model


def test_qwen35_every_case_of_llama_cpp(qwen35_vocab):
    cases = _cases("ggml-vocab-qwen35.gguf")
    assert len(cases) == 50
    wrong = [(text, qwen35_vocab.tokenize(text, add_special=False), want) for text, want in cases
             if qwen35_vocab.tokenize(text, add_special=False) != want]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, the first: {wrong[0]!r}"
