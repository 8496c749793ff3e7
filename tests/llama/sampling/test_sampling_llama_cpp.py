"""The samplers llama.cpp has beyond the default chain (Mirostat 1 and 2, XTC, top-n-sigma,
dynamic temperature and min_keep in make_sampler), against picks of llama.cpp's own library
(tests/tools/sampler_vectors.py drives libllama through ctypes) and hand-computed cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from llama.sampling import (XTC, Candidates, Dist, LogitBias, SamplerChain, Temperature, TopNSigma,
                            make_sampler)
from llama.sampling.mirostat import Mirostat, MirostatV2, discrete_pick, truncate_to_int
from llama.sampling.mt19937 import StdMT19937
from tests.llama.sampling.test_sampling import P4, cands, int_row

# --- Mirostat ------------------------------------------------------------------------

# picks of llama.cpp's own llama_sampler_init_temp + llama_sampler_init_mirostat(_v2)
# (libllama from the source llama-cpp-python 0.3.36 vendors), made by
# tests/tools/sampler_vectors.py: (version, n_vocab, seed, tau, eta, temp, steps), picks
MIROSTAT_PICKS = [
    ((1, 1000, 42, 5.0, 0.1, 1.0, 24),
     [964, 420, 120, 697, 231, 71, 245, 965, 122, 619, 813, 16, 790, 427, 707, 758, 938, 575, 612, 109, 386, 220, 63, 234]),
    ((1, 49152, 1234, 6.0, 0.3, 1.2, 24),
     [48597, 48634, 48671, 48708, 48745, 48782, 48819, 48856, 48893, 48930, 48967, 49004, 49041, 49078, 49115, 0, 37, 74, 111, 148, 185, 222, 259, 296]),
    ((1, 262144, 7, 8.0, 0.1, 1.5, 8),
     [161527, 161564, 161601, 161638, 161675, 161712, 161749, 161786]),
    ((1, 50, 3, 2.0, 0.5, 1.0, 24),
     [23, 19, 47, 7, 44, 8, 45, 32, 19, 15, 43, 3, 17, 27, 14, 23, 1, 38, 39, 49, 13, 36, 37, 47]),
    ((1, 2, 11, 0.5, 1.0, 1.0, 16),
     [1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]),
    ((2, 1000, 42, 5.0, 0.1, 1.0, 24),
     [881, 180, 692, 623, 194, 508, 268, 605, 2, 845, 256, 799, 559, 427, 136, 44, 638, 575, 612, 989, 709, 220, 823, 557]),
    ((2, 49152, 1234, 6.0, 0.3, 1.2, 24),
     [31795, 48634, 48800, 48708, 29151, 48782, 47942, 48856, 36004, 48930, 47781, 49004, 31556, 49078, 32082, 0, 39129, 74, 24533, 44390, 185, 43181, 259, 37136]),
    ((2, 262144, 7, 8.0, 0.1, 1.5, 8),
     [256349, 203382, 254914, 161638, 226977, 210752, 161749, 221412]),
    ((2, 50, 3, 2.0, 0.5, 1.0, 24),
     [23, 19, 47, 7, 44, 8, 45, 32, 19, 15, 43, 3, 17, 27, 14, 23, 1, 11, 12, 49, 13, 23, 37, 47]),
    ((2, 2, 11, 0.5, 1.0, 1.0, 16),
     [1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]),
]
MIROSTAT_ZIPF_PICKS = [
    ((1, 49152, 99, 5.0, 0.1, 1.0, 24),
     [6862, 23581, 11846, 19248, 48745, 32543, 36544, 39036, 33660, 44020, 46512, 29364, 41676, 46623, 29475, 44242, 46734, 27131, 17348, 46845, 44427, 5184, 15041, 46993]),
    ((1, 1000, 5, 3.0, 0.2, 0.9, 24),
     [946, 803, 20, 757, 94, 131, 168, 702, 265, 656, 256, 233, 390, 864, 464, 501, 538, 832, 109, 146, 566, 723, 760, 114]),
    ((2, 49152, 99, 5.0, 0.1, 1.0, 24),
     [9317, 28491, 14301, 21703, 48745, 37453, 36544, 39036, 36115, 44020, 46512, 29364, 41676, 46623, 29475, 44242, 46734, 27131, 17348, 46845, 44427, 7639, 15041, 46993]),
]


def _zipf_row(n: int) -> np.ndarray:
    row = np.zeros(n, np.float32)
    row[np.argsort(int_row(n), kind="stable")[::-1]] = (-1.1 * np.log(np.arange(1, n + 1))).astype(np.float32)
    return row


@pytest.mark.parametrize("rows, case, expected",
                         [(int_row, c, p) for c, p in MIROSTAT_PICKS] + [(_zipf_row, c, p) for c, p in MIROSTAT_ZIPF_PICKS],
                         ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else None)
def test_mirostat_matches_llama_cpp_picks(rows, case, expected):
    version, n, seed, tau, eta, temp, steps = case
    miro = Mirostat(n, seed, tau, eta, 100) if version == 1 else MirostatV2(seed, tau, eta)
    chain = SamplerChain([Temperature(temp), miro])
    row = rows(n)
    assert [chain.sample(np.roll(row, 37 * s)) for s in range(steps)] == expected
    chain.reset()   # mu back to 2 tau, the stream restarted: the same picks again
    assert miro.mu == np.float32(2 * tau)
    assert [chain.sample(np.roll(row, 37 * s)) for s in range(steps)] == expected


def test_mirostat_mu_follows_the_surprise():
    # mirostat 2.0 over P4 with tau 1, eta 0.5: mu starts at 2 and moves by eta * (surprise - tau)
    miro = MirostatV2(42, 1.0, 0.5)
    chain = SamplerChain([miro])
    logits = np.log(np.array(P4, dtype=np.float32))
    mu = np.float32(2.0)
    for _ in range(6):
        keep = [p for p in sorted(P4, reverse=True) if -math.log2(p) <= mu] or [0.4]
        token = chain.sample(logits)
        p = np.float32(P4[token] / sum(keep))
        assert P4[token] in keep
        mu = np.float32(mu - np.float32(0.5) * np.float32(-np.log2(np.float64(p)).astype(np.float32) - np.float32(1.0)))
        assert miro.mu == pytest.approx(mu, abs=2e-6)


def test_discrete_pick_is_libstdcxx_discrete_distribution():
    # seed 42's draws u = 0.7965, 0.1834, 0.7797, 0.5969 against partial sums 0.1, 0.3, 0.6, 1
    rng = StdMT19937(42)
    probs = np.array(P4, dtype=np.float32)
    assert [discrete_pick(probs, rng) for _ in range(4)] == [3, 1, 3, 2]
    rng = StdMT19937(5)
    assert discrete_pick(np.ones(1, np.float32), rng) == 0   # one weight: no draw
    assert rng.uniform01() == StdMT19937(5).uniform01()


def test_mirostat_truncation_to_int_is_x86s():
    assert [truncate_to_int(np.float32(v)) for v in (2.9, -2.9, 0.5, 3e9, -3e9, np.inf, np.nan)] == \
        [2, -2, 0, -2**31, -2**31, -2**31, -2**31]


def test_mirostat_in_make_sampler_and_its_errors():
    assert str(make_sampler(n_vocab=10, mirostat=1)) == "logits -> penalties -> temp -> mirostat"
    assert str(make_sampler(n_vocab=10, mirostat=2)) == "logits -> penalties -> temp -> mirostat-v2"
    assert str(make_sampler(n_vocab=10, mirostat=2, temp=0.0)) == "logits -> penalties -> greedy"
    with pytest.raises(ValueError, match="mirostat must be 0"):
        make_sampler(n_vocab=10, mirostat=3)
    with pytest.raises(ValueError, match="mirostat_tau"):
        make_sampler(n_vocab=10, mirostat=1, mirostat_tau=float("nan"))
    chain = SamplerChain([LogitBias(3, {0: -math.inf, 1: -math.inf, 2: -math.inf}), MirostatV2(1)])
    with pytest.raises(ValueError, match="-inf"):
        chain.sample(np.zeros(3, dtype=np.float32))


def test_make_sampler_min_keep_and_dynamic_temperature():
    chain = make_sampler(n_vocab=10, min_keep=3, dynatemp_range=0.5, dynatemp_exponent=2.0)
    assert str(chain) == "logits -> penalties -> top-k -> typical -> top-p -> min-p -> temp-ext -> dist"
    typical, top_p, min_p, temp = chain.samplers[2:6]
    assert typical.min_keep == top_p.min_keep == min_p.min_keep == 3
    assert (temp.t, temp.delta, temp.exponent) == (0.8, 0.5, 2.0)
    assert "temp ->" in str(make_sampler(n_vocab=10))          # no range: plain temperature
    for bad in (dict(min_keep=-1), dict(dynatemp_range=-0.1), dict(dynatemp_exponent=float("inf"))):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_sampler(n_vocab=10, **bad)


# top-n-sigma and xtc in front of temp + dist, by llama.cpp's library (the same tool):
# (sampler, n_vocab, seed, n or probability, threshold, temp, steps) over _zipf_row, picks
FILTER_PICKS = [
    (('top-n-sigma', 1000, 42, 1.0, 0.0, 1.0, 16),
     [946, 480, 517, 57, 94, 131, 168, 205, 242, 279, 316, 850, 887, 427, 961, 501]),
    (('top-n-sigma', 49152, 9, 2.5, 0.0, 0.7, 16),
     [46142, 48634, 21666, 46253, 24195, 48782, 38999, 39036, 46438, 48930, 44057, 46549, 49041, 49078, 49115, 0]),
    (('xtc', 1000, 42, 0.5, 0.1, 1.0, 24),
     [567, 300, 780, 840, 374, 71, 365, 205, 242, 702, 316, 882, 383, 427, 984, 164, 538, 575, 44, 589, 63, 723, 957, 292]),
    (('xtc', 49152, 9, 0.9, 0.05, 1.0, 24),
     [45639, 12755, 46216, 14338, 46290, 12967, 41454, 41491, 28750, 20416, 14597, 41136, 25400, 37308, 6517, 41787, 41824, 49021, 33970, 44176, 47205, 43398, 14861, 29471]),
]


@pytest.mark.parametrize("case, expected", FILTER_PICKS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else None)
def test_top_n_sigma_and_xtc_match_llama_cpp_picks(case, expected):
    kind, n, seed, a, b, temp, steps = case
    row = _zipf_row(n)

    def picks(with_filter: bool) -> list[int]:
        first = [TopNSigma(a) if kind == "top-n-sigma" else XTC(a, b, 1, seed)] if with_filter else []
        chain = SamplerChain(first + [Temperature(temp), Dist(seed)])
        return [chain.sample(np.roll(row, 37 * s)) for s in range(steps)]

    assert picks(True) == expected
    assert picks(False) != expected   # the filter changed the picks


def test_xtc_cut_and_its_draw():
    # probs 0.4, 0.3, 0.2, 0.1 sorted; threshold 0.25: 0.4 and 0.3 are at or above it, the
    # least probable of them (0.3) is kept: 3 candidates left
    xtc = XTC(1.0, 0.25, 1, 42)
    cur = cands(P4)
    xtc.apply(cur)
    assert list(cur.ids) == [2, 1, 0] and cur.sorted
    np.testing.assert_allclose(cur.probs, [0.3, 0.2, 0.1], atol=1e-6)   # the pre-cut softmax
    cur = cands(P4)
    XTC(1.0, 0.25, 4, 42).apply(cur)          # 3 < min_keep 4: nothing removed
    assert len(cur) == 4
    cur = cands(P4)
    XTC(1.0, 0.5, 1, 42).apply(cur)           # nothing at or above 0.5 but the top: pos_last 0
    assert len(cur) == 4
    assert not XTC(0.0, 0.1).enabled and not XTC(0.5, 0.6).enabled
    # the chance is uniform_real_distribution<float>: one 32-bit draw over 2**32
    rng = StdMT19937(42)
    assert rng.uniform01_float() == np.float32(np.float32(StdMT19937(42).next_u32()) / np.float32(2.0**32))


def test_top_n_sigma_masks_below_max_minus_n_sigma():
    logits = np.array([2.0, 1.0, 0.0, -1.0, -np.inf], dtype=np.float32)
    cur = Candidates.from_logits(logits)
    TopNSigma(1.0).apply(cur)   # over the four finite: mean 0.5, sigma sqrt(1.25) = 1.118
    np.testing.assert_array_equal(cur.logits, [2.0, 1.0, -np.inf, -np.inf, -np.inf])
    cur = Candidates.from_logits(logits)
    TopNSigma(0.0).apply(cur)   # n <= 0: off
    np.testing.assert_array_equal(cur.logits, logits)
    assert str(make_sampler(n_vocab=5, top_n_sigma=1.0, xtc_probability=0.5)) == (
        "logits -> penalties -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> xtc -> temp -> dist")
