"""The llguidance tokenizer built from a Vocab agrees with the Vocab token by token."""
from __future__ import annotations

import pytest

from llama.grammar import build_tokenizer, tokenizer_for


@pytest.fixture(params=["smollm2_vocab", "gemma3_vocab"])
def vocab(request):
    return request.getfixturevalue(request.param)


def test_token_bytes_equal_token_to_piece_for_every_token(vocab):
    """All but SPM's byte-fallback token <0xFF>: llguidance reads a leading 0xFF byte as its
    special-token marker. 0xFF never occurs in UTF-8, so no text grammar can need it."""
    tok = tokenizer_for(vocab)
    assert tok.vocab_size == vocab.n_vocab
    mismatched = [tid for tid in range(vocab.n_vocab)
                  if tok.decode_bytes([tid]) != vocab.token_to_piece(tid, special=True)]
    assert all(vocab.token_to_piece(tid, special=True) == b"\xff" for tid in mismatched)
    assert [vocab.token_text(tid) for tid in mismatched] == \
        (["<0xFF>"] if vocab.model_name == "llama" else [])


def test_special_tokens_are_exactly_the_hidden_ones(vocab):
    """Special = rendered only with special=True (llama.cpp's common/llguidance.cpp rule)."""
    tok = tokenizer_for(vocab)
    expected = {tid for tid in range(vocab.n_vocab)
                if vocab.token_to_piece(tid) == b"" and vocab.token_to_piece(tid, special=True)}
    got = {tid for tid in range(vocab.n_vocab) if tok.is_special_token(tid)}
    assert got - expected == {tid for tid in range(vocab.n_vocab)
                              if vocab.token_to_piece(tid, special=True) == b"\xff"}
    assert expected <= got
    assert vocab.eog_ids <= got  # end-of-generation tokens can never be written as text


def test_eos_tokens_are_the_end_of_generation_ids(vocab):
    tok = tokenizer_for(vocab)
    assert set(tok.eos_tokens) == set(vocab.eog_ids)
    primary = vocab.eot_id if vocab.eot_id is not None else vocab.eos_id
    assert tok.eos_token == primary


def test_tokenize_callback_is_the_vocab_tokenizer(vocab):
    tok = tokenizer_for(vocab)
    for text in ['{"name": "Ada", "age": 36}', "hello world\n\n  x", "déjà vu 123"]:
        assert tok.tokenize_str(text) == vocab.tokenize(text, add_special=False)


def test_tokenizer_is_built_once_per_vocab(smollm2_vocab):
    first = tokenizer_for(smollm2_vocab)
    assert tokenizer_for(smollm2_vocab) is first
    assert build_tokenizer(smollm2_vocab) is not first  # building explicitly gives a new one


def test_tokenizer_is_freed_with_its_vocab():
    import gc
    import weakref

    import llama

    vocab = llama.Model.load("smollm2-135m", vocab_only=True).vocab
    tokenizer = tokenizer_for(vocab)
    assert tokenizer.tokenize_str("free me") == vocab.tokenize("free me", add_special=False)
    ref = weakref.ref(vocab)
    del vocab, tokenizer
    gc.collect()
    assert ref() is None
