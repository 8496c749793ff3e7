"""DRY (sampling/dry.py) against llama.cpp's own llama_sampler_init_dry: the logits it
changes after a history of tokens, bit for bit (tests/tools/sampler_vectors.py drives
libllama through ctypes), with and without SmolLM2's sequence breakers; and the `samplers`
order (sampling/order.py) as llama.cpp's names and letters read."""
from __future__ import annotations

import numpy as np
import pytest

from llama.sampling import Candidates, make_sampler
from llama.sampling.dry import DRY, process_breakers
from llama.sampling.order import DEFAULT_ORDER, parse_order
from tests.llama.sampling.test_sampling import int_row
from tests.tools.sampler_vectors import DRY_CASES, DRY_TEXT, dry_history

INF = float("inf")

# (n_vocab, multiplier, base, allowed_length, penalty_last_n) as in DRY_CASES, and the
# [id, logit] llama.cpp's DRY changed over int_row after the case's history
DRY_CHANGED = [
    ([1000, 0.8, 1.75, 2, 64], [[1, -5.332790374755859], [4, 5.068839073181152]]),
    ([1000, 1.5, 2.0, 2, 32], []),
    ([1000, 0.8, 1.75, 2, 1000], [[0, -21.130470275878906], [1, -5.932790279388428], [2, -3.515580415725708]]),
    ([1000, 0.8, 1.75, 2, 400], [[0, -2.0095632950093563e+38]]),
    ([1000, 1.0, 2.0, 1, 400], [[4, -INF]]),   # 2^128 overflows float: the logit is -inf
    ([1000, 0.5, 1.0, 0, 16], [[0, -8.5], [1, -5.032790184020996], [2, -1.5655803680419922], [4, 5.368839263916016]]),
    ([1000, 0.8, 1.75, 4, 64], [[40, 1.2883926630020142]]),
]

# DRY_TEXT as llama.cpp tokenises it with SmolLM2's vocabulary, and the changes per
# (multiplier, base, allowed_length, penalty_last_n, breakers)
VOCAB_HISTORY = [
    11126, 42, 732, 314, 260, 3947, 702, 1834, 47, 198, 24412, 42, 357, 314, 1672, 13312, 5568, 26, 284,
    3091, 42, 216, 34, 37, 5027, 30, 198, 11126, 42, 732, 314, 260, 3947, 702, 1834, 47, 198, 24412, 42,
    357, 314, 1672, 13312, 5568, 26, 284, 3091, 42, 216, 34, 37, 5027, 30, 198, 11126, 42, 732, 314, 260,
    3947, 702, 13759, 47, 198, 24412, 42, 357, 314, 1672, 13312, 5568, 26, 284, 3091, 42, 216, 34, 37,
    5027, 30, 198, 11126, 42, 732, 314, 260, 3947, 702]
VOCAB_CHANGED = [
    ([0.8, 1.75, 2, 64, ["\n", ":", "\"", "*"]], [[1834, -5.424697399139404], [13759, -2.9476418495178223]]),
    ([0.8, 1.75, 2, 200, ["\n", ":", "\"", "*"]], [[1834, -5.424697399139404], [13759, -2.9476418495178223]]),
    ([1.0, 1.5, 1, 200, ["User:", "weather like"]], []),
    ([0.8, 1.75, 2, 200, ["is the"]], [[1834, -1.9371974468231201], [13759, 0.5398580431938171]]),
]


def changed_by(dry: DRY, history: list[int], row: np.ndarray) -> dict[int, np.float32]:
    for t in history:
        dry.accept(t)
    cur = Candidates.from_logits(row)
    dry.apply(cur)
    return {int(i): v for i, v in zip(cur.ids, cur.logits) if v != row[i]}


@pytest.mark.parametrize("case, expected", DRY_CHANGED)
def test_dry_changes_the_logits_llama_cpp_changes(case, expected):
    (n_vocab, mult, base, allowed, last_n), seed_case = case, None
    for c in DRY_CASES:
        if list(c[:5]) == case:
            seed_case = c
    history = dry_history(*seed_case[5:])
    got = changed_by(DRY(mult, base, allowed, last_n), history, int_row(n_vocab))
    assert got == {i: np.float32(v) for i, v in expected}


@pytest.mark.parametrize("case, expected", VOCAB_CHANGED)
def test_dry_breakers_of_a_real_vocabulary(smollm2_path, case, expected):
    from llama.model import Model

    mult, base, allowed, last_n, strings = case
    model = Model.load(str(smollm2_path), vocab_only=True)
    assert model.tokenize(DRY_TEXT, add_special=False) == VOCAB_HISTORY
    vocab = model.vocab
    pieces = [vocab.detokenize_bytes([t], unparse_special=True) for t in range(vocab.n_vocab)]
    breakers = process_breakers(strings, pieces,
                                lambda s: model.tokenize(s, add_special=False, parse_special=False))
    got = changed_by(DRY(mult, base, allowed, last_n, breakers), VOCAB_HISTORY, int_row(vocab.n_vocab))
    assert got == {i: np.float32(v) for i, v in expected}
    if strings == ["is the"]:   # " is" then " the": the head " is" carries the tail [" the"]
        is_, the = model.tokenize(" is the", add_special=False)
        assert ((the,) in breakers[is_]) and () not in breakers[is_]


def test_dry_breaker_processing_by_hand():
    pieces = [b"a", b"ab", b"xa", b"b:", b"c", b"*"]
    tokenize = {"b": [1000], ":b": [2000, 1000]}.get
    got = process_breakers([":", "ab"], pieces, lambda s: tokenize(s))
    # "b:" holds ":" (alone); "ab" holds "ab"; "a" and "xa" end with "a", so "b" follows them
    assert got == {3: ((),), 1: ((),), 0: ((1000,),), 2: ((1000,),)}
    with pytest.raises(ValueError, match=r"dry_sequence_breakers\[1\]"):
        process_breakers([":", ""], pieces, lambda s: [])


def test_dry_stops_at_a_breaker_and_spares_it():
    # 5 6 7 | 9 5 6 7 ... : the repeat "5 6 7" would continue with 9, unless 9 breaks it
    history = [5, 6, 7, 9, 5, 6, 7]
    row = np.zeros(20, np.float32)
    plain = changed_by(DRY(1.0, 2.0, 2, 64), history, row)
    assert plain == {9: np.float32(-2.0)}          # 1 * 2^(3 - 2)
    spared = changed_by(DRY(1.0, 2.0, 2, 64, {9: ((),)}), history, row)
    assert spared == {}                            # 9 is a breaker: never penalised
    # a breaker in the middle (7) limits the repeat to what follows it: "" -> nothing
    cut = changed_by(DRY(1.0, 2.0, 1, 64, {7: ((),)}), history, row)
    assert cut == {}


def test_dry_off_and_its_errors():
    for off in (DRY(0.0), DRY(1.0, 0.5), DRY(1.0, 1.75, 2, 0)):
        assert not off.enabled
        off.accept(3)
        assert changed_by(off, [1, 2, 1, 2, 1], np.zeros(8, np.float32)) == {}
    with pytest.raises(ValueError, match="dry_allowed_length"):
        DRY(1.0, 1.75, -1)
    with pytest.raises(ValueError, match="dry_penalty_last_n"):
        DRY(1.0, 1.75, 2, -1)


def test_sampler_order_names_letters_and_errors():
    assert parse_order(None) == DEFAULT_ORDER
    assert parse_order("edskypmxt") == DEFAULT_ORDER         # llama.cpp's default as letters
    assert parse_order(["Top-K", "minp", "nucleus", "temp", "typ", "top_n_sigma"]) == (
        "top_k", "min_p", "top_p", "temperature", "typ_p", "top_n_sigma")
    with pytest.raises(ValueError, match=r"samplers\[1\]: unknown sampler 'bogus'"):
        parse_order(["top_k", "bogus"])
    with pytest.raises(ValueError, match="unknown sampler character 'z'"):
        parse_order("kz")
    with pytest.raises(ValueError, match="'infill' is not implemented"):
        parse_order(["infill"])


def test_make_sampler_follows_the_order():
    def names(**kw) -> str:
        return str(make_sampler(n_vocab=100, seed=1, **kw))

    assert names() == "logits -> penalties -> top-k -> typical -> top-p -> min-p -> temp -> dist"
    assert names(dry_multiplier=0.8) == ("logits -> penalties -> dry -> top-k -> typical -> top-p"
                                         " -> min-p -> temp -> dist")
    assert names(samplers=["temperature", "top_k", "top_k"]) == "logits -> temp -> top-k -> top-k -> dist"
    assert names(samplers="") == "logits -> dist"
    # greedy keeps the repetition samplers the order names, and only those
    assert names(temp=0.0, dry_multiplier=0.8) == "logits -> penalties -> dry -> greedy"
    assert names(temp=0.0, samplers="kt") == "logits -> greedy"
    # the order decides what runs first: top-k before or after the temperature, same pick
    row = int_row(100)
    a = make_sampler(n_vocab=100, seed=5, samplers="kt").sample(row)
    b = make_sampler(n_vocab=100, seed=5, samplers="tk").sample(row)
    assert a == b
    # DRY in a chain: the repeated continuation loses to the rest under greedy
    chain = make_sampler(n_vocab=20, temp=0.0, dry_multiplier=5.0, dry_allowed_length=1)
    chain.accept_many([3, 4, 3])
    row = np.zeros(20, np.float32)
    row[4], row[5] = 1.0, 0.5
    assert chain.sample(row) == 5                  # 4 would repeat "3 4": 1 - 5 * 1.75^1 < 0.5
    assert make_sampler(n_vocab=20, temp=0.0).sample(row) == 4
