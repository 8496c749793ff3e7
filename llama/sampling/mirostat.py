"""Mirostat 1.0 and 2.0 (llama_sampler_init_mirostat / _v2): select a token so that the
surprise of the text stays near a target `tau`, adjusting a bound `mu` after every pick.

Both are the last stage of a chain, as in llama.cpp (where llama-server and the CLI put
them after the temperature). Their arithmetic is llama.cpp's, step by step in float32:
the softmax of the sorted candidates (candidates.py: glibc-rounded expf, a left-to-right
float sum), `logf`/`log2f`/`powf` evaluated in float64 and rounded once (glibc's float
functions are correctly rounded in all but vanishingly rare cases), products and sums
rounded per operation (llama.cpp's own library is built without FMA contraction), and
`int(k)` as x86's truncating conversion (a k past the int range comes out as INT_MIN, so
the clamp to at least 1 keeps one candidate).

The pick is `llama_sample_dist`: libstdc++'s `std::discrete_distribution` over the float
probabilities (each widened to double, divided by their double sum, partial sums in double
with the last set to 1, one `generate_canonical<double, 53>` draw, the first partial sum
reaching it); a single candidate is picked without a draw. Over the same logits, seed and
parameters the picks are llama.cpp's (tests/llama/sampling/test_sampling_llama_cpp.py holds picks produced
by the library itself).
"""
from __future__ import annotations

import numpy as np

from .candidates import F32, Candidates, logf, seq_sum_f32
from .mt19937 import StdMT19937
from .params import check_float, check_int
from .pick import check_seed, resolve_seed
from .samplers import Sampler

INT_MIN = -(2 ** 31)


def discrete_pick(probs: np.ndarray, rng: StdMT19937) -> int:
    """std::discrete_distribution<int>(probs)(rng), libstdc++'s (see the module docstring)."""
    if len(probs) < 2:
        return 0
    weights = probs.astype(np.float64)
    total = np.cumsum(weights)[-1]           # std::accumulate: left to right, in double
    cumulative = np.cumsum(weights / total)  # std::partial_sum of the normalised weights
    cumulative[-1] = 1.0
    return int(np.searchsorted(cumulative, rng.uniform01(), side="left"))


def log2f(x: np.ndarray) -> np.ndarray:
    """float32 log2 with glibc's rounding; log2(0) is -inf without a warning."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log2(np.asarray(x, dtype=np.float64)).astype(F32)


def powf(x: float, y: float) -> np.float32:
    """float32 pow with glibc's rounding (overflow gives inf, as powf does)."""
    with np.errstate(all="ignore"):
        return F32(np.power(np.float64(F32(x)), np.float64(F32(y))))


def truncate_to_int(k: np.float32) -> int:
    """(int)k on x86 (cvttss2si): toward zero; NaN or out of range gives INT_MIN."""
    value = float(k)
    if value != value or not INT_MIN <= value < 2 ** 31:
        return INT_MIN
    return int(value)


class _Mirostat(Sampler):
    """What both versions share: the seeded generator, mu, and its update after a pick."""

    def __init__(self, seed: int | None = None, tau: float = 5.0, eta: float = 0.1) -> None:
        self.seed = check_seed(seed)
        self.tau = F32(check_float("mirostat_tau", tau))
        self.eta = F32(check_float("mirostat_eta", eta))
        self.seed_cur = resolve_seed(self.seed)
        self._rng = StdMT19937(self.seed_cur)
        self.mu = F32(2.0) * self.tau

    def reset(self) -> None:
        self.mu = F32(2.0) * self.tau
        self.seed_cur = resolve_seed(self.seed)
        self._rng.seed(self.seed_cur)

    def _sorted_softmax(self, cur: Candidates) -> None:
        """llama_sampler_softmax_impl(cur_p, true), refusing what has nothing to draw from."""
        if len(cur) == 0:
            raise ValueError(f"{self.name}: no candidates to pick from")
        with np.errstate(invalid="ignore"):   # all -inf: refused just below
            cur.softmax(do_sort=True)
        if cur.logits[0] == -np.inf:
            raise ValueError(f"{self.name}: every candidate has logit -inf, there is nothing to draw from")

    def _pick(self, cur: Candidates) -> None:
        """Softmax of what is left, the draw, and mu's update from the pick's surprise."""
        cur.softmax(do_sort=True)
        idx = discrete_pick(cur.probs, self._rng)
        cur.selected = idx
        observed = -log2f(cur.probs[idx:idx + 1])[0]
        error = F32(observed - self.tau)
        self.mu = F32(self.mu - F32(self.eta * error))


class Mirostat(_Mirostat):
    """llama_sampler_init_mirostat(n_vocab, seed, tau, eta, m): estimate the Zipf exponent
    s from the m most probable tokens, keep the top k that the target surprise allows,
    draw among them."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int | None = None, tau: float = 5.0, eta: float = 0.1,
                 m: int = 100) -> None:
        self.n_vocab = check_int("n_vocab", n_vocab, 1)
        self.m = check_int("mirostat m", m, 1)
        super().__init__(seed, tau, eta)
        # t_i = logf((i + 2) / (i + 1)) and the running float sum of t_i^2 depend on m alone
        i = np.arange(self.m - 1)
        self._t = logf((i + 2).astype(F32) / (i + 1).astype(F32))
        self._sum_t_sq = np.cumsum(self._t * self._t, dtype=F32)   # left to right, as the loop

    def apply(self, cur: Candidates) -> None:
        self._sorted_softmax(cur)
        n = min(self.m - 1, len(cur) - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            b = logf(cur.probs[:n] / cur.probs[1:n + 1])
            sum_ti_bi = seq_sum_f32(self._t[:n] * b)
            sum_ti_sq = self._sum_t_sq[n - 1] if n else F32(0.0)
            s_hat = F32(sum_ti_bi / sum_ti_sq)
            epsilon_hat = F32(s_hat - F32(1.0))
            numerator = F32(epsilon_hat * powf(2.0, self.mu))
            denominator = F32(F32(1.0) - powf(float(self.n_vocab), -epsilon_hat))
            k = powf(F32(numerator / denominator), F32(F32(1.0) / s_hat))
        cur.truncate(min(max(truncate_to_int(k), 1), len(cur)))   # top-k of sorted candidates
        self._pick(cur)


class MirostatV2(_Mirostat):
    """llama_sampler_init_mirostat_v2(seed, tau, eta): keep the candidates (by probability)
    up to the first whose surprise -log2 p exceeds mu (at least one), draw among them."""

    name = "mirostat-v2"

    def apply(self, cur: Candidates) -> None:
        self._sorted_softmax(cur)
        over = np.flatnonzero(-log2f(cur.probs) > self.mu)
        cur.truncate(max(int(over[0]) if len(over) else len(cur), 1))
        self._pick(cur)
