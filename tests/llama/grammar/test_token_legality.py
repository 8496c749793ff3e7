"""Token by token, the mask allows exactly the tokens an independent matcher allows.

The oracle is Python's `regex` module with partial matching: a token is legal when the
output so far plus its bytes is still a prefix of some word of the language. Every token
of the vocabulary is checked at every step of a random walk: tokens with a character
outside the language's alphabet can never be legal and must all be masked; the others are
matched one by one. The mask must never allow an illegal token; it must allow every legal
one except where llguidance forces bytes (there it keeps only the canonical token, which
the reference matcher's `compute_ff_bytes` tells). End-of-generation tokens are allowed
exactly when the output so far is a complete word, and other special tokens never.
"""
from __future__ import annotations

import llguidance
import numpy as np
import pytest
import regex

from llama.grammar import Grammar, GrammarSampler, tokenizer_for

from .helpers import applied_mask

# (grammar, the same language as a Python pattern, its alphabet)
CASES = [
    pytest.param(lambda: Grammar.from_regex(r"[a-z]{2,6}(-[0-9]{1,3}){0,2}"),
                 r"[a-z]{2,6}(-[0-9]{1,3}){0,2}", "abcdefghijklmnopqrstuvwxyz-0123456789",
                 id="regex"),
    pytest.param(lambda: Grammar.from_gbnf('root ::= item ("," item)*\n'
                                           'item ::= [a-c]+ | [0-9] [0-9]?'),
                 r"([a-c]+|[0-9][0-9]?)(,([a-c]+|[0-9][0-9]?))*", "abc,0123456789", id="gbnf"),
    pytest.param(lambda: Grammar.from_regex(r"[<|>a-z_]{1,16}"), r"[<|>a-z_]{1,16}",
                 "<|>abcdefghijklmnopqrstuvwxyz_", id="special-token-text"),
]


@pytest.mark.parametrize("vocab_name", ["smollm2_vocab", "gemma3_vocab"])
@pytest.mark.parametrize("make_grammar, pattern, alphabet", CASES)
def test_mask_matches_independent_oracle(request, pieces_of, vocab_name, make_grammar, pattern,
                                         alphabet):
    vocab = request.getfixturevalue(vocab_name)
    grammar = make_grammar()
    oracle = regex.compile(pattern)
    pieces, plain_pieces = pieces_of(vocab)
    texts = [p.decode("latin-1") for p in pieces]  # the languages are ASCII: 1 byte = 1 char
    eog = np.array(sorted(vocab.eog_ids))
    # special tokens are not text, whatever their name spells: never legal, EOG aside
    special = np.array([p == b"" for p in plain_pieces])
    in_alphabet = np.array([bool(t) and set(t) <= set(alphabet) for t in texts]) & ~special
    inside = np.flatnonzero(in_alphabet)
    outside = ~in_alphabet
    outside[eog] = False
    assert special[outside].sum() > 0 and outside[eog].sum() == 0

    sampler = GrammarSampler(vocab, grammar)
    reference = llguidance.LLMatcher(tokenizer_for(vocab), grammar.definition, log_level=0)
    rng = np.random.default_rng(len(pattern) + vocab.n_vocab)
    out = ""
    for step in range(10):
        allowed = applied_mask(sampler, vocab.n_vocab)
        assert not allowed[outside].any(), f"step {step}: a token outside the alphabet is allowed"
        legal = np.array([oracle.fullmatch(out + texts[t], partial=True) is not None
                          for t in inside])
        wrongly_allowed = inside[allowed[inside] & ~legal]
        assert wrongly_allowed.size == 0, \
            f"after {out!r}: illegal tokens allowed: {[texts[t] for t in wrongly_allowed[:5]]}"
        if not reference.compute_ff_bytes():
            missing = inside[legal & ~allowed[inside]]
            assert missing.size == 0, \
                f"after {out!r}: legal tokens masked: {[texts[t] for t in missing[:5]]}"
        complete = oracle.fullmatch(out) is not None
        assert (allowed[eog] == complete).all(), f"after {out!r}: EOG allowed={allowed[eog]}"
        choices = np.flatnonzero(allowed[inside])
        if complete and (choices.size == 0 or rng.random() < 0.15):
            sampler.accept(int(eog[0]))
            assert sampler.is_finished()
            return
        token = int(inside[rng.choice(choices)])
        sampler.accept(token)
        assert reference.consume_token(token)
        out += texts[token]
        assert oracle.fullmatch(out, partial=True)
