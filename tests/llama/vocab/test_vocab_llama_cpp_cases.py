"""llama.cpp's own tokenizer cases: its tests/test-tokenizer-0 over models/ggml-vocab-*.gguf
with their .inp/.out files, for every one of those vocabularies whose tokenizer ggmlpy
supports (15: BPE under 11 pre-tokenizers, SPM twice, WPM, and Gemma 4's SPM-style BPE).

data/ holds each vocabulary file xz-compressed with its cases, written by
tests/tools/vocab_cases.py, which also writes detokenized.json: llama.cpp's text of each
case's tokens (test-tokenizer-0 only prints that text; here it is checked too).
"""
from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

import llama
import llama.models  # noqa: F401  (registers every architecture)
from ggmlpy.gguf import GGUFFile
from llama.arch import ARCHS
from llama.vocab import Vocab

DATA = Path(__file__).parent / "data"
SEP = "\n__ggml_vocab_test__\n"
VOCABS = sorted(p.name[:-len(".xz")] for p in DATA.glob("ggml-vocab-*.gguf.xz"))


def _cases(name: str) -> list[tuple[str, list[int]]]:
    """The .inp texts split as test-tokenizer-0 splits them (the last one may lack its
    separator, as Gemma 4's does), with the .out token lists."""
    texts = (DATA / f"{name}.inp").read_bytes().decode("utf-8").split(SEP)
    if texts and texts[-1] == "":
        texts.pop()   # the file ends with a separator
    outs = (DATA / f"{name}.out").read_bytes().decode("utf-8").split("\n")
    if outs and outs[-1] == "":
        outs.pop()
    assert len(texts) == len(outs), f"{name}: {len(texts)} inputs, {len(outs)} outputs"
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


def _load(path: Path) -> Vocab:
    """The vocabulary as `llama.Model.load(vocab_only=True)` builds it. That refuses an
    architecture ggmlpy cannot run (bert, command-r, falcon, gemma4, gpt2, mpt, refact,
    starcoder2) where llama.cpp loads the vocabulary anyway; those build it from the
    metadata directly, as Model.load does."""
    with GGUFFile(path) as f:
        arch = f.metadata["general.architecture"]
        if arch not in ARCHS:
            return Vocab.from_metadata(dict(f.metadata))
    return llama.Model.load(str(path), vocab_only=True).vocab


@pytest.fixture(scope="module")
def detokenized() -> dict[str, list[list[str]]]:
    return json.loads((DATA / "detokenized.json").read_text(encoding="ascii"))


def test_every_stored_vocabulary_has_its_cases(detokenized):
    assert len(VOCABS) == 15
    assert sorted(detokenized) == VOCABS


@pytest.mark.parametrize("name", VOCABS)
def test_every_case_of_llama_cpp(name, detokenized, tmp_path):
    """Tokens without special tokens added (as test-tokenizer-0), then the text of the
    expected tokens as llama.cpp detokenizes them, with both settings of the flags."""
    path = tmp_path / name
    path.write_bytes(lzma.decompress((DATA / f"{name}.xz").read_bytes()))
    vocab = _load(path)
    cases = _cases(name)
    assert len(cases) == (50 if name == "ggml-vocab-qwen35.gguf" else 46)
    wrong = [(text, got, want) for text, want in cases
             if (got := vocab.tokenize(text, add_special=False)) != want]
    assert not wrong, f"{name}: {len(cases) - len(wrong)} of {len(cases)} pass, the first wrong: {wrong[0]!r}"
    texts = [[vocab.detokenize_bytes(ids, remove_special=False, unparse_special=True),
              vocab.detokenize_bytes(ids, remove_special=True, unparse_special=False)]
             for _, ids in cases]
    want = [[t.encode("utf-8", "surrogateescape") for t in pair] for pair in detokenized[name]]
    wrong = [(text, got, exp) for (text, _), got, exp in zip(cases, texts, want) if got != exp]
    assert not wrong, f"{name}: {len(cases) - len(wrong)} of {len(cases)} detokenize alike, first: {wrong[0]!r}"
