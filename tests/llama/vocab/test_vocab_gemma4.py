"""Gemma 4's SPM-style BPE on a hand-made vocabulary: each rule llama.cpp applies to it, one
at a time (the real vocabulary's 46 cases are in test_vocab_llama_cpp_cases.py, where some
of these rules never decide anything). The expected ids are llama.cpp's on the same
vocabulary written as a GGUF."""
from __future__ import annotations

import numpy as np
import pytest

from llama.vocab import TokenAttr, Vocab, VocabError

SPECIAL = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 3), ("<mask>", 3)]
BYTES = [(f"<0x{b:02X}>", 6) for b in range(256)]
NORMAL = ["\n", "\n\n\n", "\u2581", "a", "b", "\u2581a", "ab", "?", "</s>"]
MARKERS = [("<turn|>", 3), ("<|turn>", 3), ("<|tool_response>", 4)]
TOKENS = SPECIAL + BYTES + [(t, 1) for t in NORMAL] + MARKERS
ID = {text: i for i, (text, _) in enumerate(TOKENS)}
MERGES = ["\u2581 a", "a b"]


def gemma4_md(**keys) -> dict:
    md = {"tokenizer.ggml.model": "gemma4",
          "tokenizer.ggml.tokens": [t for t, _ in TOKENS],
          "tokenizer.ggml.token_type": np.array([k for _, k in TOKENS], np.int32),
          "tokenizer.ggml.merges": list(MERGES),
          "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
          "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
          "tokenizer.ggml.add_bos_token": False}
    md.update(keys)
    return md


@pytest.fixture(scope="module")
def gemma4() -> Vocab:
    return Vocab.from_metadata(gemma4_md())


def test_spaces_merge_as_u2581_and_lines_are_the_words(gemma4):
    assert gemma4.tokenize(" a b", add_special=False) == [ID["\u2581a"], ID["\u2581"], ID["b"]]
    assert gemma4.tokenize("ab ab", add_special=False) == [ID["ab"], ID["\u2581a"], ID["b"]]
    assert gemma4.tokenize("a\nb", add_special=False) == [ID["a"], ID["\n"], ID["b"]]


def test_a_run_of_newlines_that_is_a_token_is_that_token(gemma4):
    """No merge makes "\\n\\n\\n", yet the run is its token; a run that is no token splits."""
    assert gemma4.tokenize("\n\n\n", add_special=False) == [ID["\n\n\n"]]
    assert gemma4.tokenize("\n\n", add_special=False) == [ID["\n"], ID["\n"]]
    assert gemma4.tokenize("a\n\n\nb", add_special=False) == [ID["a"], ID["\n\n\n"], ID["b"]]
    assert gemma4.linefeed_id == ID["\n"]


def test_missing_symbols_fall_back_to_byte_tokens(gemma4):
    assert gemma4.tokenize("\u00e9a", add_special=False) == [ID["<0xC3>"], ID["<0xA9>"], ID["a"]]
    assert gemma4.detokenize_bytes([ID["<0xC3>"], ID["<0xA9>"], ID["\u2581a"]]) == "\u00e9 a".encode()


def test_bos_is_added_even_when_the_file_says_not(gemma4):
    assert gemma4.add_bos is True and gemma4.add_eos is False
    assert gemma4.tokenize("a") == [ID["<bos>"], ID["a"]]


def test_special_ids_come_from_the_file_only():
    """llama.cpp gives the gemma4 model no default ids (gpt2's are 11): without a BOS id the
    vocabulary loads and tokenizing with special tokens fails, as llama.cpp's assert does."""
    md = gemma4_md()
    del md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"]
    v = Vocab.from_metadata(md)
    assert v.bos_id is None and v.eos_id is None
    assert v.tokenize("a", add_special=False) == [ID["a"]]
    with pytest.raises(VocabError, match="no BOS token"):
        v.tokenize("a")


def test_end_of_generation_and_attributes(gemma4):
    assert gemma4.eog_ids == {ID["<eos>"], ID["<turn|>"], ID["<|tool_response>"]}
    tool_response = gemma4.token_attr(ID["<|tool_response>"])
    assert tool_response == TokenAttr.USER_DEFINED | TokenAttr.CONTROL
    # "</s>" is an ordinary word here, not paddleocr's end of generation
    assert gemma4.token_attr(ID["</s>"]) == TokenAttr.NORMAL and not gemma4.is_eog(ID["</s>"])
    assert gemma4.tokenize("a<turn|>", add_special=False, parse_special=True) == [ID["a"], ID["<turn|>"]]


def test_pieces_and_detokenize(gemma4):
    assert gemma4.token_to_piece(ID["\u2581a"]) == b" a"
    assert gemma4.token_to_piece(ID["<0xC3>"]) == b"\xc3"
    assert gemma4.token_to_piece(ID["<turn|>"]) == b""
    assert gemma4.token_to_piece(ID["<turn|>"], special=True) == b"<turn|>"
    assert gemma4.token_to_piece(ID["<|tool_response>"]) == b""   # user-defined, made control as EOG
    # clean_spaces stays on for gemma4 (llama.cpp's BPE default): " ?" loses its space
    assert gemma4.detokenize(gemma4.tokenize(" a ?", add_special=False)) == " a?"


def test_the_file_pre_tokenizer_name_is_ignored():
    v = Vocab.from_metadata(gemma4_md(**{"tokenizer.ggml.pre": "gpt-2"}))
    assert v.model.pre_name == "gemma4"
    assert v.tokenize(" a\n\n\n", add_special=False) == [ID["\u2581a"], ID["\n\n\n"]]


def test_gpt2_model_with_gemma4_and_sarvam_pre_tokenizers():
    """The same pre-tokenizer under "gpt2" (gpt2's default ids then apply); sarvam-moe has
    the SPM-style merges but neither Gemma 4 fix, and keeps its spaces."""
    md = gemma4_md(**{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "granite-embed-multi-311m"})
    v = Vocab.from_metadata(md)
    assert v.add_bos is True and v.tokenize(" a\n\n\n") == [ID["<bos>"], ID["\u2581a"], ID["\n\n\n"]]
    md.update({"tokenizer.ggml.pre": "sarvam-moe"})
    v = Vocab.from_metadata(md)
    assert v.add_bos is False
    assert v.tokenize(" a\n\n\n") == [ID["\u2581a"], ID["\n"], ID["\n"], ID["\n"]]
    assert v.detokenize(v.tokenize(" a ?")) == " a ?"
    del md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"]
    assert Vocab.from_metadata(md).eos_id == 11
