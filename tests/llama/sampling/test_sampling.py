"""The sampler chain against hand-computed values, llama.cpp's own sampler test vectors
(tests/test-sampling.cpp) and picks made by std::mt19937 with libstdc++."""
from __future__ import annotations

import math

import numpy as np
import pytest

from llama.sampling import (Candidates, Dist, Greedy, LogitBias, MinP, Penalties, SamplerChain,
                            Temperature, TemperatureExt, TopK, TopP, Typical, make_sampler)
from llama.sampling.candidates import _order_desc_direct, logf_scalar, order_desc
from llama.sampling.mt19937 import StdMT19937

P4 = [0.1, 0.2, 0.3, 0.4]


def cands(probs) -> Candidates:
    """Candidates with logit = log(p), as llama.cpp's sampler_tester builds them."""
    logits = np.log(np.asarray(probs, dtype=np.float32))
    return Candidates(np.arange(len(logits)), logits, np.asarray(probs, dtype=np.float32))


def run(samplers, probs, last_tokens=()) -> Candidates:
    """Apply samplers then a Dist (which normalises probs), as test-sampling.cpp does."""
    cur = cands(probs)
    for s in samplers:
        for t in last_tokens:
            s.accept(t)
        s.apply(cur)
    Dist(0).apply(cur)
    return cur


def int_row(n: int) -> np.ndarray:
    """Distinct logits in [-8, 8) made with integer arithmetic only (bit-identical anywhere)."""
    i = np.arange(n, dtype=np.int64)
    return (((i * 2654435761) % 2**24 - 2**23) / 2**20).astype(np.float32)


def softmax(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


# --- std::mt19937 and the uniform double ---------------------------------------------

def test_mt19937_matches_the_cpp_standard():
    g = StdMT19937(5489)  # the default seed; [rand.predef] requires 4123659995 at 10000
    first = [g.next_u32() for _ in range(2)]
    assert first == [3499211612, 581869302]
    for _ in range(9997):
        g.next_u32()
    assert g.next_u32() == 4123659995


def test_uniform_double_is_two_draws_low_word_first():
    raw = StdMT19937(42)
    lo, hi = raw.next_u32(), raw.next_u32()
    assert (lo, hi) == (1608637542, 3421126067)
    u = StdMT19937(42).uniform01()
    assert u == (lo + hi * 2.0**32) / 2.0**64
    assert u == pytest.approx(0.79654298428784598, abs=1e-17)


# --- Dist ----------------------------------------------------------------------------

def test_dist_hand_computed_picks():
    # seed 42 draws u = 0.7965, 0.1834, 0.7797, 0.5969 (libstdc++); cumulative probs are
    # 0.1, 0.3, 0.6, 1.0, so the picks are the first index whose cumsum reaches u
    chain = SamplerChain([Dist(42)])
    logits = np.log(np.array(P4, dtype=np.float32))
    assert [chain.sample(logits) for _ in range(4)] == [3, 1, 3, 2]


@pytest.mark.parametrize("n, seed, top_k, temp, expected", [
    (1000, 42, 0, 1.0, [812, 203, 789, 609, 443, 106, 461, 346, 152, 668]),
    (262144, 1234, 40, 0.8, [114882, 254314, 102607, 256769, 251859, 146797, 144342, 254314,
                             146797, 151707]),
    (262144, 7, 0, 1.5, [59672, 83686, 256450, 119468, 80811, 69238, 22787, 109975, 4190,
                         138361]),
])
def test_dist_matches_libstdcxx_picks(n, seed, top_k, temp, expected):
    # expected: a C++ program with std::mt19937(seed), uniform_real_distribution<double>,
    # expf and a double running sum (llama.cpp's dist), built with g++/libstdc++
    chain = SamplerChain([TopK(top_k), Temperature(temp), Dist(seed)])
    logits = int_row(n)
    assert [chain.sample(logits) for _ in range(10)] == expected


def test_dist_reproducible_and_reset_restarts_the_stream():
    logits = int_row(500)
    a, b = SamplerChain([Dist(99)]), SamplerChain([Dist(99)])
    seq_a = [a.sample(logits) for _ in range(20)]
    assert seq_a == [b.sample(logits) for _ in range(20)]
    a.reset()
    assert [a.sample(logits) for _ in range(20)] == seq_a
    c = SamplerChain([Dist(100)])
    assert [c.sample(logits) for _ in range(20)] != seq_a


def test_dist_random_seed_is_drawn_again_on_reset():
    d = Dist(None)
    assert d.seed == 0xFFFFFFFF and 0 <= d.seed_cur <= 0xFFFFFFFF
    seen = {d.seed_cur}
    for _ in range(3):
        d.reset()
        seen.add(d.seed_cur)
    assert len(seen) > 1
    assert Dist(-1).seed == 0xFFFFFFFF


def test_dist_empirical_distribution_matches_softmax():
    logits = np.array([1.0, 0.5, 0.0, -1.0, 2.0], dtype=np.float32)
    chain = SamplerChain([Dist(2024)])
    n = 20000
    counts = np.bincount([chain.sample(logits) for _ in range(n)], minlength=5)
    expected = softmax(logits) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001
    np.testing.assert_allclose(chain.last.probs.sum(), 1.0, atol=1e-6)
    np.testing.assert_allclose(chain.last.probs, softmax(logits), atol=1e-6)


def test_dist_single_candidate_uses_no_random_draw():
    logits = int_row(300)
    a = SamplerChain([TopK(1), Dist(5)])
    assert [a.sample(logits) for _ in range(3)] == [int(np.argmax(logits))] * 3
    # the stream was not advanced: a Dist with the same seed still starts at the first draw
    d = a.samplers[1]
    assert d._rng.uniform01() == StdMT19937(5).uniform01()


def test_dist_over_only_minus_inf_raises():
    chain = SamplerChain([LogitBias(3, {0: -math.inf, 1: -math.inf, 2: -math.inf}), Dist(1)])
    with pytest.raises(ValueError, match="-inf"):
        chain.sample(np.zeros(3, dtype=np.float32))


# --- greedy / temperature --------------------------------------------------------------

def test_greedy_is_argmax_first_on_ties():
    rng = np.random.default_rng(3)
    chain = SamplerChain([Greedy()])
    for _ in range(20):
        row = rng.standard_normal(1000).astype(np.float32)
        assert chain.sample(row) == int(np.argmax(row))
    assert SamplerChain([Greedy()]).sample(np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)) == 1


def test_temperature_scales_logits():
    cur = run([Temperature(0.5)], P4)
    np.testing.assert_allclose(cur.probs, softmax(np.log(P4) / 0.5), atol=1e-6)
    np.testing.assert_allclose(run([Temperature(1.0)], P4).probs, P4, atol=1e-5)  # upstream


@pytest.mark.parametrize("t", [0.0, -1.0])
def test_temperature_zero_keeps_only_the_max(t):
    np.testing.assert_allclose(run([Temperature(t)], P4).probs, [0, 0, 0, 1], atol=1e-5)
    chain = SamplerChain([Temperature(t), Dist(3)])
    row = int_row(2000)
    assert {chain.sample(row) for _ in range(10)} == {int(np.argmax(row))}


def test_temperature_ext():
    # delta = 0 is plain temperature (upstream vectors)
    np.testing.assert_allclose(run([TemperatureExt(1.0, 0.0, 1.0)], P4).probs, P4, atol=1e-5)
    zero = run([TemperatureExt(0.0, 0.0, 1.0)], P4)
    np.testing.assert_allclose(zero.probs, [0, 0, 0, 1], atol=1e-5)
    # delta > 0: t_dyn = (t - d) + 2d * (H / log n) ** exponent
    probs = np.array(P4)
    h = -(probs * np.log(probs)).sum()
    t_dyn = 0.5 + 1.0 * (h / math.log(4)) ** 2.0
    cur = cands(P4)
    TemperatureExt(1.0, 0.5, 2.0).apply(cur)
    assert cur.sorted and list(cur.ids) == [3, 2, 1, 0]
    np.testing.assert_allclose(cur.probs, softmax(np.log(probs[::-1]) / t_dyn), atol=1e-6)


# --- top-k / top-p / min-p / typical (upstream vectors first) ------------------------------

@pytest.mark.parametrize("k, expected", [
    (1, [1.0]), (3, [0.44444, 0.33333, 0.22222]), (4, [0.4, 0.3, 0.2, 0.1]), (0, P4),
])
def test_top_k_upstream(k, expected):
    np.testing.assert_allclose(run([TopK(k)], P4).probs, expected, atol=1e-5)


def test_top_k_large_vocab_matches_full_sort_with_ties():
    rng = np.random.default_rng(11)
    row = rng.integers(-50, 50, size=262144).astype(np.float32)  # many equal logits
    ref = np.lexsort((np.arange(len(row)), -row))  # by logit desc, then id
    for k in (1, 40, 1000, 70000):
        cur = Candidates.from_logits(row)
        TopK(k).apply(cur)
        assert cur.sorted and np.array_equal(cur.ids, ref[:k])
    assert np.array_equal(order_desc(row, len(row)), ref)


def _rows(rng):
    """Rows the native top-k pass must rank like a full sort: random, heavy ties, half -inf,
    ascending (every value a new best), and lengths that leave a tail after the 16-wide
    chunks."""
    for n in (1, 15, 16, 17, 100, 4097, 49152):
        yield rng.standard_normal(n).astype(np.float32)
        yield rng.integers(-3, 3, n).astype(np.float32)
        half = rng.standard_normal(n).astype(np.float32)
        half[rng.random(n) < 0.5] = -np.inf
        yield half
        yield np.sort(rng.standard_normal(n).astype(np.float32))


def test_native_top_k_ranks_like_a_full_sort():
    from llama.sampling.top_k_native import top_k_indices

    rng = np.random.default_rng(5)
    for row in _rows(rng):
        ref = np.lexsort((np.arange(len(row)), -row))   # logit descending, then id
        for k in (1, 2, 40, 128, len(row)):
            got = top_k_indices(row, k)
            assert got is not None and np.array_equal(got, ref[:min(k, len(row))]), (len(row), k)


def test_native_top_k_leaves_nan_rows_to_numpy():
    from llama.sampling.top_k_native import top_k_indices

    row = np.random.default_rng(6).standard_normal(1000).astype(np.float32)
    for at in (3, 999):   # in a 16-wide chunk and in the tail
        bad = row.copy()
        bad[at] = np.nan
        assert top_k_indices(bad, 40) is None
        # order_desc then ranks the numpy way, as before the native pass existed
        assert np.array_equal(order_desc(bad, 40), _order_desc_direct(bad, 40))
    with pytest.raises(ValueError, match="float32"):
        top_k_indices(row.astype(np.float64), 4)


@pytest.mark.parametrize("p, expected", [
    (0.0, [1.0]), (0.7, [0.571429, 0.428571]), (0.8, [0.44444, 0.33333, 0.22222]), (1.0, P4),
])
def test_top_p_upstream(p, expected):
    np.testing.assert_allclose(run([TopP(p, 0)], P4).probs, expected, atol=1e-5)


def test_top_p_cut_position_and_min_keep():
    # probs 0.4, 0.3, 0.2, 0.1 sorted: cumsum 0.4, 0.7, 0.9, 1.0
    for p, n in [(0.35, 1), (0.4, 1), (0.41, 2), (0.69, 2), (0.71, 3), (0.95, 4)]:
        cur = cands(P4)
        TopP(p).apply(cur)
        assert list(cur.ids) == [3, 2, 1, 0][:n], p
    cur = cands(P4)
    TopP(0.1, min_keep=3).apply(cur)
    assert list(cur.ids) == [3, 2, 1]
    np.testing.assert_allclose(cur.probs, [0.4, 0.3, 0.2], atol=1e-6)  # pre-cut softmax


def _cut_by_masks(probs: np.ndarray, p: float, min_keep: int) -> int | None:
    """TopP's cut as written out: 1 + the first i with cumsum >= p and i + 1 >= min_keep."""
    cum = np.cumsum(probs, dtype=np.float32)
    for i, c in enumerate(cum):
        if c >= np.float32(p) and i + 1 >= min_keep:
            return i + 1
    return None


def test_top_p_cut_binary_search_matches_masks():
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(400):
        n = int(rng.integers(1, 60))
        probs = rng.dirichlet(np.full(n, 0.3)).astype(np.float32)
        if trial % 5 == 0:
            probs[rng.integers(0, n, size=max(1, n // 3))] = 0.0   # zero runs: plateaus in the sum
        if trial % 17 == 0:
            probs[rng.integers(0, n)] = np.nan
        total = float(np.cumsum(probs, dtype=np.float32)[-1])   # the sum itself: a tie at the end
        for p in (0.0, 0.3, 0.9, 0.95, 0.999999, 1.0, total if total == total else 0.5):
            for min_keep in (0, 1, 3, n, n + 2):
                got = TopP(min(p, 1.0), min_keep)._cut(probs, np.float32(p))
                assert got == _cut_by_masks(probs, p, min_keep), (trial, p, min_keep)
                checked += 1
    assert checked == 400 * 7 * 5
    assert TopP(0.5)._cut(np.zeros(0, np.float32), np.float32(0.5)) is None


def test_min_p_sorted_cut_binary_search_matches_masks():
    rng = np.random.default_rng(11)
    for trial in range(300):
        n = int(rng.integers(1, 50))
        logits = -np.sort(-rng.standard_normal(n).astype(np.float32) * 3)
        if trial % 4 == 0:
            logits[rng.integers(0, n, size=max(1, n // 2))] = logits[0]   # ties with the max
            logits = -np.sort(-logits)
        if trial % 7 == 0:
            logits[-(1 + n // 4):] = -np.inf
        if trial % 13 == 0:
            logits[-1] = np.nan
        for p in (0.0001, 0.05, 0.3, 0.9, 1.0):
            for min_keep in (0, 1, 2, n, n + 3):
                min_logit = logits[0] + logf_scalar(p)
                rest = np.arange(1, n)
                stop = (logits[1:] < min_logit) & (rest >= min_keep)
                want = int(rest[np.argmax(stop)]) if stop.any() else n
                assert MinP(p, min_keep)._sorted_cut(logits, min_logit) == want, (trial, p, min_keep)


def test_logit_bias_adds_each_id_once():
    row = np.arange(8, dtype=np.float32)
    cur = Candidates.from_logits(row)
    LogitBias(8, {2: 1.5, 5: -np.inf, np.int64(7): -2.0}).apply(cur)
    np.testing.assert_array_equal(cur.logits, [0, 1, 3.5, 3, 4, -np.inf, 6, 5])
    np.testing.assert_array_equal(row, np.arange(8))   # the caller's row is untouched


def test_top_p_large_unsorted_matches_reference():
    row = int_row(50000) * np.float32(0.6)
    p = np.float32(0.9)
    order = np.argsort(-row, kind="stable")
    e = np.exp(row.astype(np.float64) - row.max()).astype(np.float32)
    probs = e / np.cumsum(e, dtype=np.float32)[-1]
    n_ref = int(np.argmax(np.cumsum(probs[order], dtype=np.float32) >= p)) + 1
    assert n_ref > 256  # needs more than the first ranked block
    cur = Candidates.from_logits(row)
    TopP(0.9).apply(cur)
    assert cur.sorted and np.array_equal(cur.ids, order[:n_ref])


@pytest.mark.parametrize("p, expected", [
    (0.00, P4), (0.24, P4), (0.26, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (0.49, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]), (0.51, [0.3 / 0.7, 0.4 / 0.7]),
    (0.74, [0.3 / 0.7, 0.4 / 0.7]), (0.76, [1.0]), (1.00, [1.0]),
])
def test_min_p_upstream(p, expected):
    np.testing.assert_allclose(run([MinP(p, 0)], P4).probs, expected, atol=1e-5)


def test_min_p_threshold_is_relative_to_max_prob():
    # max prob 0.4: p = 0.5 keeps probs >= 0.2, i.e. tokens 1, 2, 3; same on sorted input
    cur = cands(P4)
    MinP(0.5).apply(cur)
    assert list(cur.ids) == [1, 2, 3] and not cur.sorted  # unsorted path keeps the order
    cur = cands(P4)
    TopK(4).apply(cur)
    MinP(0.5).apply(cur)
    assert list(cur.ids) == [3, 2, 1]
    cur = cands(P4)
    MinP(0.9, min_keep=3).apply(cur)  # only 1 passes: falls back to the sorted rule
    assert list(cur.ids) == [3, 2, 1] and cur.sorted


def test_typical_upstream():
    peaked = run([Typical(0.5, 0)], [0.97, 0.01, 0.01, 0.01])
    np.testing.assert_allclose(peaked.probs, [1.0], atol=1e-5)
    cur = cands([0.4, 0.2, 0.2, 0.2])
    Typical(0.5, 0).apply(cur)
    np.testing.assert_allclose(cur.probs, [0.2, 0.2, 0.2], atol=1e-5)


def test_typical_entropy_selection():
    probs = np.array([0.5, 0.25, 0.15, 0.1])
    h = -(probs * np.log(probs)).sum()  # 1.2080
    score = np.abs(-np.log(probs) - h)  # 0.515, 0.178, 0.689, 1.095 -> order 1, 0, 2, 3
    assert list(np.argsort(score)) == [1, 0, 2, 3]
    for p, kept in [(0.2, [1]), (0.5, [1, 0]), (0.8, [1, 0, 2]), (0.95, [1, 0, 2, 3])]:
        cur = cands(probs)
        Typical(p).apply(cur)
        assert list(cur.ids) == kept, p
        assert not cur.sorted
    cur = cands(probs)
    Typical(0.2, min_keep=3).apply(cur)
    assert list(cur.ids) == [1, 0, 2]


# --- penalties / logit bias -----------------------------------------------------------

def test_penalties_upstream():
    uniform = [0.2] * 5
    cases = [
        ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
        ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
        ([0, 1, 2, 0, 0], [0.0, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
    ]
    for last, expected, rep, freq, pres in cases:
        sampler = Penalties(len(last), rep, freq, pres)
        np.testing.assert_allclose(run([sampler], uniform, last).probs, expected, atol=1e-5)


def test_penalty_formula():
    logits = np.array([2.0, -1.0, 0.0, 3.0, 1.0], dtype=np.float32)
    pen = Penalties(last_n=8, repeat=2.0, freq=0.5, present=0.25)
    for t in [0, 1, 1, 2, 0, 0]:
        pen.accept(t)
    assert pen.counts == {0: 3, 1: 2, 2: 1}
    cur = Candidates(np.arange(5), logits)
    pen.apply(cur)
    # > 0: divide; <= 0: multiply; then - count * freq - present
    expected = [2.0 / 2 - 3 * 0.5 - 0.25, -1.0 * 2 - 2 * 0.5 - 0.25, 0.0 * 2 - 0.5 - 0.25, 3.0, 1.0]
    np.testing.assert_allclose(cur.logits, expected, atol=1e-6)
    assert not cur.sorted


def test_penalty_ring_buffer_window_and_reset():
    pen = Penalties(last_n=3, repeat=1.5)
    for t in [7, 8, 9, 7, 10]:
        pen.accept(t)
    assert pen.counts == {9: 1, 7: 1, 10: 1}  # the first 7 and the 8 left the window
    pen.reset()
    assert pen.counts == {}
    off = Penalties(last_n=0, repeat=1.5)
    off.accept(3)
    cur = Candidates(np.arange(5), np.ones(5, dtype=np.float32))
    off.apply(cur)
    assert off.counts == {} and np.all(cur.logits == 1.0)


def test_penalties_find_tokens_after_reordering():
    row = int_row(5000)
    pen = Penalties(last_n=16, repeat=1.3, freq=0.1)
    for t in [5, 17, 4999, 17]:
        pen.accept(t)
    direct = Candidates.from_logits(row)
    pen.apply(direct)
    shuffled = Candidates.from_logits(row)
    shuffled.take(np.random.default_rng(1).permutation(5000))
    pen.apply(shuffled)
    np.testing.assert_array_equal(shuffled.logits, direct.logits[shuffled.ids])


def test_logit_bias():
    row = np.zeros(6, dtype=np.float32)
    chain = SamplerChain([LogitBias(6, {2: 1.5, 4: -math.inf}), Greedy()])
    assert chain.sample(row) == 2
    assert chain.last.logits[4] == -np.inf and chain.last.logits[2] == 1.5
    assert np.all(row == 0)  # the caller's logits are untouched
    cur = Candidates.from_logits(np.arange(6, dtype=np.float32))
    cur.take(np.array([5, 3, 1, 0, 2, 4]))
    LogitBias(6, {0: 10.0, 4: -2.0}).apply(cur)
    np.testing.assert_array_equal(cur.logits, [5, 3, 1, 10, 2, 2])


# --- chains -----------------------------------------------------------------------------

def test_chain_order_temperature_before_or_after_top_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    # top-p first: cumsum 0.5, 0.8 reaches 0.75 with 2 tokens; temp 2 then flattens them
    first = SamplerChain([TopP(0.75), Temperature(2.0), Dist(0)])
    first.sample(logits)
    assert list(first.last.ids) == [0, 1]
    np.testing.assert_allclose(first.last.probs, softmax(np.log([0.5, 0.3]) / 2), atol=1e-6)
    # temp first: probs ~ sqrt(p) = 0.379, 0.294, 0.208, 0.120, cumsum 0.67 < 0.75 -> 3 kept
    second = SamplerChain([Temperature(2.0), TopP(0.75), Dist(0)])
    second.sample(logits)
    assert list(second.last.ids) == [0, 1, 2]
    np.testing.assert_allclose(second.last.probs, softmax(np.log([0.5, 0.3, 0.15]) / 2), atol=1e-6)


def test_default_chain_on_full_vocab_matches_reference():
    row = int_row(262144) * np.float32(2000)
    chain = make_sampler(n_vocab=len(row), seed=3, top_p=0.99)
    chain.sample(row)
    # reference by full sort: top 40, top-p 0.99 keeps 26 of them, min-p 0.05 keeps those
    # within log(0.05) of the best (16), probabilities after temperature 0.8
    top = np.argsort(-row, kind="stable")[:40]
    n_p = int(np.argmax(np.cumsum(softmax(row[top])) >= 0.99)) + 1
    kept = [t for t in top[:n_p] if row[t] >= row[top[0]] + math.log(0.05)]
    assert (n_p, len(kept)) == (26, 16)
    assert list(chain.last.ids) == kept
    np.testing.assert_allclose(chain.last.probs, softmax(row[kept] / 0.8), atol=1e-6)


def test_chain_accept_history_and_penalties():
    chain = make_sampler(n_vocab=10, temp=0.0, repeat_penalty=100.0)
    row = np.array([0, 0, 0, 5, 4.9, 0, 0, 0, 0, 0], dtype=np.float32)
    assert str(chain) == "logits -> penalties -> greedy"
    assert chain.sample(row) == 3 and chain.history == []  # sample does not accept
    chain.accept(3)
    assert chain.history == [3] and chain.samplers[0].counts == {3: 1}
    assert chain.sample(row, accept=True) == 4  # 5 / 100 < 4.9
    assert chain.history == [3, 4] and chain.n_sample == 2
    chain.reset()
    assert chain.history == [] and chain.samplers[0].counts == {} and chain.sample(row) == 3


def test_make_sampler_structure_and_defaults():
    chain = make_sampler(n_vocab=100, logit_bias={1: 2.0})
    assert str(chain) == ("logits -> logit-bias -> penalties -> top-k -> typical -> top-p -> "
                          "min-p -> temp -> dist")
    _, pen, top_k, typ, top_p, min_p, temp, dist = chain.samplers
    assert (pen.last_n, pen.repeat, pen.freq, pen.present) == (64, 1.0, 0.0, 0.0)
    assert (top_k.k, typ.p, top_p.p, min_p.p, temp.t) == (40, 1.0, 0.95, 0.05, 0.8)
    assert dist.seed == 0xFFFFFFFF
    assert str(make_sampler(n_vocab=100, temp=0, seed=1)) == "logits -> penalties -> greedy"


def test_make_sampler_seed_reproduces():
    row = int_row(5000)
    a = make_sampler(n_vocab=5000, seed=77, temp=1.5, top_k=100, top_p=0.99, min_p=0.0)
    b = make_sampler(n_vocab=5000, seed=77, temp=1.5, top_k=100, top_p=0.99, min_p=0.0)
    seq = [a.sample(row) for _ in range(15)]
    assert seq == [b.sample(row) for _ in range(15)] and len(set(seq)) > 3


# --- errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    ({"top_p": 1.5}, "top_p"), ({"min_p": -0.1}, "min_p"), ({"typical_p": 2.0}, "typical_p"),
    ({"temp": math.nan}, "temp"), ({"temp": math.inf}, "temp"), ({"top_k": 2.5}, "top_k"),
    ({"repeat_penalty": 0.0}, "repeat_penalty"), ({"repeat_last_n": -1}, "repeat_last_n"),
    ({"frequency_penalty": math.nan}, "frequency_penalty"), ({"seed": 2**32}, "seed"),
    ({"seed": -2}, "seed"), ({"logit_bias": {10: 1.0}}, "logit_bias"),
    ({"logit_bias": {1: math.nan}}, "logit_bias"), ({"logit_bias": [(1, 2.0)]}, "logit_bias"),
    ({"n_vocab": 0}, "n_vocab"),
])
def test_make_sampler_rejects_bad_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_sampler(**{"n_vocab": 10, **kwargs})


def test_sampler_constructors_reject_bad_parameters():
    with pytest.raises(ValueError, match="top_p"):
        TopP(-0.5)
    with pytest.raises(ValueError, match="min_keep"):
        MinP(0.1, min_keep=-1)
    with pytest.raises(ValueError, match="temperature"):
        Temperature(math.nan)
    with pytest.raises(ValueError, match="top_k"):
        TopK(True)
    assert TopK(-5).k == -5  # <= 0 means disabled, as in llama.cpp
    cur = cands(P4)
    TopK(-5).apply(cur)
    assert len(cur) == 4


def test_chain_rejects_bad_input():
    chain = make_sampler(n_vocab=4, seed=1)
    with pytest.raises(ValueError, match="n_vocab"):
        chain.sample(np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="1-D"):
        chain.sample(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        chain.sample(np.array([0, np.nan, 1, 2], dtype=np.float32))
    with pytest.raises(ValueError, match="out of range"):
        chain.accept(4)
    with pytest.raises(ValueError, match="Dist or Greedy"):
        SamplerChain([TopK(2)]).sample(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="n_vocab"):
        SamplerChain([LogitBias(8, {1: 1.0}), Greedy()], n_vocab=4)
    assert SamplerChain([LogitBias(8, {1: 1.0}), Greedy()]).n_vocab == 8
