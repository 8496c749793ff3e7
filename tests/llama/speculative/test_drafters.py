"""The drafters without a model, and `accept` on hand-made logits rows with a real
`Sequence` (greedy, so the expected tokens are the rows' argmaxes)."""
import numpy as np
import pytest

from llama.api.sequence import SamplingParams, Sequence
from llama.speculative import (FirstOf, LlamaPromptLookupDecoding, NgramSimple, accept, as_drafter,
                               draft_budget)
from llama.speculative.draft_model import best_of_top_k

N_VOCAB = 16
EOG = 15


def _seq(max_tokens: int = 32, stop=None) -> Sequence:
    return Sequence([1, 2, 3], n_vocab=N_VOCAB, is_eog=lambda t: t == EOG, piece_of=lambda t: b"x%d " % t,
                    params=SamplingParams(temperature=0.0), max_tokens=max_tokens, stop=stop)


def _rows(picks: list[int]) -> np.ndarray:
    rows = np.zeros((len(picks), N_VOCAB), np.float32)
    rows[np.arange(len(picks)), picks] = 5.0
    return rows


def test_prompt_lookup_takes_the_earliest_match_of_the_longest_ngram():
    ids = np.array([7, 1, 2, 3, 4, 9, 1, 2, 5, 6, 1, 2], np.intc)
    # the bigram [1, 2] first occurs at 1: what follows it there
    assert LlamaPromptLookupDecoding(2, 3)(ids).tolist() == [3, 4, 9]
    assert LlamaPromptLookupDecoding(2, 10)(ids).tolist() == [3, 4, 9, 1, 2, 5, 6, 1, 2]
    # no earlier [8, 2]; the unigram [2] matches at 2
    assert LlamaPromptLookupDecoding(2, 2)(np.array([2, 5, 2, 8, 2], np.intc)).tolist() == [5, 2]
    assert LlamaPromptLookupDecoding(2, 4)(np.array([1, 2, 3], np.intc)).tolist() == []
    with pytest.raises(ValueError, match="max_ngram_size"):
        LlamaPromptLookupDecoding(0)


def test_ngram_simple_takes_the_latest_match_and_its_limits():
    n, m = 2, 3
    drafter = NgramSimple(n, m)
    base = [9, 1, 2, 10, 11, 12, 1, 2, 20, 21, 22, 23, 5]
    # history = base + [1, 2]: the pattern [1, 2] occurs at 1 and at 6; the latest wins
    assert drafter.draft(0, base + [1, 2], 8) == [20, 21, 22]
    assert drafter.draft(0, base + [1, 2], 2) == [20, 21]
    # position 0 never matches: [9, 1] occurs only there
    assert drafter.draft(0, base + [9, 1], 8) == []
    # too short a history (L must exceed n + m + 1)
    assert drafter.draft(0, [1, 2, 3, 1, 2], 8) == []
    # the latest match (at 6) has one token after it, fewer than n: nothing
    assert drafter.draft(0, [5, 6, 7, 8, 9, 4, 1, 2, 1, 2], 8) == []
    # two tokens after it: enough
    assert drafter.draft(0, [5, 6, 7, 8, 9, 4, 0, 1, 2, 3, 1, 2], 8) == [3, 1]


def test_ngram_simple_matches_a_direct_transcription():
    rng = np.random.default_rng(0)
    for _ in range(300):
        hist = rng.integers(0, 4, int(rng.integers(2, 40))).tolist()
        n, m = int(rng.integers(1, 4)), int(rng.integers(1, 6))
        assert NgramSimple(n, m).draft(0, hist, 99) == _ngram_simple_loop(hist[:-1], hist[-1], n, m)


def _ngram_simple_loop(tokens, sampled, n, m):
    """llama.cpp's common_ngram_simple_draft, loop for loop."""
    cur = len(tokens)
    if cur <= n + m + 1:
        return []
    pattern = tokens[cur - n + 1:] + [sampled]
    match = 0
    for j in range(cur - n - 1, 0, -1):
        if tokens[j:j + n] == pattern:
            match = j
            break
    if match == 0:
        return []
    count = min(m, cur - (match + n))
    return [] if count < n else tokens[match + n:match + n + count]


def test_first_of_and_callables():
    lookup = LlamaPromptLookupDecoding(1, 2)
    drafter = as_drafter(lookup)
    assert drafter.draft(0, [4, 5, 6, 4], 9) == [5, 6] and drafter.draft(0, [4, 5, 6, 4], 1) == [5]
    chain = FirstOf([NgramSimple(12, 48), as_drafter(lambda ids: [int(ids[-1]) + 1] * 5)])
    assert chain.draft(0, [1, 2, 3], 3) == [4, 4, 4]
    with pytest.raises(TypeError, match="draft_model must be"):
        as_drafter(42)


def test_accept_keeps_the_matched_prefix():
    seq = _seq()
    steps, kept = accept(seq, _rows([4, 5, 9, 7]), [4, 5, 6])
    assert [s.token for s in steps] == [4, 5, 9] and kept == 2 and seq.tokens == [4, 5, 9]
    seq = _seq()
    steps, kept = accept(seq, _rows([4, 5, 6, 8]), [4, 5, 6])   # all accepted and one more
    assert [s.token for s in steps] == [4, 5, 6, 8] and kept == 3
    seq = _seq()
    steps, kept = accept(seq, _rows([3, 5]), [4])                 # the first differs
    assert [s.token for s in steps] == [3] and kept == 0


def test_accept_stops_where_the_sequence_ends():
    seq = _seq(max_tokens=2)
    steps, kept = accept(seq, _rows([4, 5, 6, 7]), [4, 5, 6])
    assert [s.token for s in steps] == [4, 5] and steps[-1].finish_reason == "length" and kept == 1
    seq = _seq()
    steps, kept = accept(seq, _rows([4, EOG, 6]), [4, EOG])       # a drafted end of generation
    assert steps[-1].finish_reason == "stop" and seq.tokens == [4] and kept == 1
    seq = _seq(stop=["x5"])
    steps, kept = accept(seq, _rows([4, 5, 6]), [4, 5])
    assert seq.finished and seq.completion_text() == "x4 " and len(steps) == 2
    with pytest.raises(ValueError, match="2 logits rows for a draft of 2"):
        accept(_seq(), _rows([1, 2]), [1, 2])


def test_draft_budget_is_llama_servers():
    assert draft_budget(16, n_past=10, n_ctx=100, n_remaining=50) == 16
    assert draft_budget(16, n_past=90, n_ctx=100, n_remaining=50) == 8      # n_ctx - n_past - 2
    assert draft_budget(16, n_past=10, n_ctx=100, n_remaining=4) == 3       # n_remaining - 1
    assert draft_budget(16, n_past=98, n_ctx=100, n_remaining=4) == 0


def test_best_of_top_k_normalises_over_the_top_ten():
    logits = np.full(50, -1e9, np.float32)
    logits[:12] = np.log(np.array([8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], np.float64))
    token, p = best_of_top_k(logits)
    assert token == 0 and p == pytest.approx(8 / 17, rel=1e-6)
