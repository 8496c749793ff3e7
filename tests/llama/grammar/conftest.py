"""Fixtures for the grammar tests: the two real vocabularies and a SmolLM2 context."""
from __future__ import annotations

import pytest

import llama
from llama.vocab import Vocab


@pytest.fixture(scope="session")
def smollm2_vocab() -> Vocab:
    return llama.Model.load("smollm2-135m", vocab_only=True).vocab


@pytest.fixture(scope="session")
def gemma3_vocab() -> Vocab:
    return llama.Model.load("gemma3-270m", vocab_only=True).vocab


@pytest.fixture(scope="session")
def smollm2_ctx() -> llama.Context:
    """One CPU context for every generation test (cleared before each use)."""
    model = llama.Model.load("smollm2-135m")
    return llama.Context(model, n_ctx=512)


@pytest.fixture(scope="session")
def piece_tables() -> dict[int, tuple[list[bytes], list[bytes]]]:
    """Per vocab (by id()): every token's bytes with and without special rendering."""
    return {}


@pytest.fixture
def pieces_of(piece_tables):
    def pieces(vocab: Vocab) -> tuple[list[bytes], list[bytes]]:
        key = id(vocab)
        if key not in piece_tables:
            ids = range(vocab.n_vocab)
            piece_tables[key] = ([vocab.token_to_piece(t, special=True) for t in ids],
                                 [vocab.token_to_piece(t) for t in ids])
        return piece_tables[key]
    return pieces
