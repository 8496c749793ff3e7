"""GrammarSampler as a chain stage: prompt tokens, forbidden tokens, ends, reset, prefetch."""
from __future__ import annotations

import numpy as np
import pytest

from llama.grammar import Grammar, GrammarError, GrammarSampler, LlamaGrammar
from llama.sampling import Candidates, Greedy, SamplerChain, make_sampler

from .helpers import applied_mask

YES_NO = 'root ::= "yes" | "no"'


def tokens_of(vocab, text):
    return vocab.tokenize(text, add_special=False)


def test_make_sampler_puts_the_grammar_first(smollm2_vocab):
    grammar = GrammarSampler(smollm2_vocab, Grammar.from_gbnf(YES_NO))
    for temp in (0.0, 0.8):
        chain = make_sampler(n_vocab=smollm2_vocab.n_vocab, temp=temp, logit_bias={5: 1.0},
                             grammar=grammar)
        assert chain.samplers[0] is grammar
        assert str(chain).startswith("logits -> grammar -> logit-bias -> penalties")


def test_chain_picks_only_allowed_tokens_even_against_the_logits(smollm2_vocab):
    vocab = smollm2_vocab
    yes = tokens_of(vocab, "yes")
    chain = make_sampler(n_vocab=vocab.n_vocab, temp=0.0,
                         grammar=GrammarSampler(vocab, Grammar.from_regex("yes|no")))
    logits = np.zeros(vocab.n_vocab, dtype=np.float32)
    logits[tokens_of(vocab, "maybe")[0]] = 50.0  # the model's favourite is forbidden
    logits[yes[0]] = 1.0
    out = []
    for _ in range(4):
        token = chain.sample(logits, accept=True)
        if vocab.is_eog(token):
            break
        out.append(token)
    assert vocab.detokenize(out) == "yes"


def test_prompt_tokens_do_not_reach_the_matcher(smollm2_vocab):
    """The prompt is accepted by the chain (penalties) but is no grammar output."""
    vocab = smollm2_vocab
    grammar = GrammarSampler(vocab, Grammar.from_gbnf(YES_NO))
    chain = SamplerChain([grammar, Greedy()], n_vocab=vocab.n_vocab)
    initial = grammar.allowed_tokens()
    chain.accept_many(tokens_of(vocab, "Answer with yes or no. {not: grammar}"))
    assert grammar.n_consumed == 0
    assert (applied_mask(grammar, vocab.n_vocab) == initial).all()
    assert chain.history  # the chain itself did record the prompt


def test_forbidden_token_raises_and_leaves_the_state_alone(smollm2_vocab):
    vocab = smollm2_vocab
    grammar = GrammarSampler(vocab, Grammar.from_gbnf(YES_NO))
    allowed = applied_mask(grammar, vocab.n_vocab)
    bad = tokens_of(vocab, "maybe")[0]
    assert not allowed[bad]
    with pytest.raises(GrammarError, match=f"token {bad} is not allowed"):
        grammar.accept(bad)
    with pytest.raises(GrammarError, match="cannot end here"):
        grammar.accept(vocab.eos_id)
    assert grammar.n_consumed == 0
    for token in tokens_of(vocab, "no"):
        applied_mask(grammar, vocab.n_vocab)
        grammar.accept(token)
    assert grammar.is_accepting() and grammar.is_finished()


def test_eog_only_once_complete_and_only_eog_when_finished(smollm2_vocab):
    vocab = smollm2_vocab
    eog = sorted(vocab.eog_ids)
    grammar = GrammarSampler(vocab, Grammar.from_regex("[0-9]{2,3}"))
    assert not applied_mask(grammar, vocab.n_vocab)[eog].any()
    for text, complete, finished in [("1", False, False), ("2", True, False), ("3", True, True)]:
        (token,) = tokens_of(vocab, text)
        grammar.accept(token)
        allowed = applied_mask(grammar, vocab.n_vocab)
        assert allowed[eog].all() == complete == grammar.is_accepting()
        assert grammar.is_finished() == finished
    assert np.flatnonzero(allowed).tolist() == eog  # finished: nothing but the end


def test_reset_starts_over(smollm2_vocab):
    vocab = smollm2_vocab
    grammar = GrammarSampler(vocab, LlamaGrammar.from_string(YES_NO))
    initial = applied_mask(grammar, vocab.n_vocab)
    for token in tokens_of(vocab, "yes"):
        applied_mask(grammar, vocab.n_vocab)
        grammar.accept(token)
    assert grammar.is_finished()
    grammar.reset()
    assert grammar.n_consumed == 0 and not grammar.is_accepting()
    assert (applied_mask(grammar, vocab.n_vocab) == initial).all()


def test_prefetch_gives_the_same_masks(smollm2_vocab):
    vocab = smollm2_vocab
    schema = {"type": "object",
              "properties": {"id": {"type": "integer"},
                             "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["id", "tags"]}
    text = '{"id": 42, "tags": ["a", "b"]}'
    samplers = [GrammarSampler(vocab, Grammar.from_json_schema(schema), prefetch=p)
                for p in (True, False)]
    for token in tokens_of(vocab, text):
        masks = [applied_mask(s, vocab.n_vocab) for s in samplers]
        assert (masks[0] == masks[1]).all()
        assert masks[0][token]
        for s in samplers:
            s.accept(token)
    assert all(s.is_accepting() for s in samplers)
    prefetching, direct = (s.stats for s in samplers)
    assert prefetching.prefetched == prefetching.masks > 0 and direct.prefetched == 0
    for s in samplers:
        s.close()


def test_apply_respects_a_reduced_candidate_list(smollm2_vocab):
    """Not first in a chain, the grammar still masks by token id, not by position."""
    vocab = smollm2_vocab
    grammar = GrammarSampler(vocab, Grammar.from_regex("no"))
    (no,) = tokens_of(vocab, "no")
    ids = np.array([7, no, 3], dtype=np.int32)
    cur = Candidates(ids, np.array([3.0, 1.0, 2.0], dtype=np.float32))
    grammar.apply(cur)
    assert np.isfinite(cur.logits).tolist() == [False, True, False]
    cur = Candidates(np.array([7, 3], dtype=np.int32), np.zeros(2, dtype=np.float32))
    with pytest.raises(GrammarError, match="none of the remaining candidates"):
        grammar.apply(cur)


def test_grammar_sampler_needs_a_grammar(smollm2_vocab):
    with pytest.raises(GrammarError, match="must be a Grammar"):
        GrammarSampler(smollm2_vocab, 'root ::= "x"')
