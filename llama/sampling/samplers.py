"""The samplers that reshape the candidate list, after llama.cpp's `src/llama-sampling.cpp`.

Each class mirrors one `llama_sampler_init_*`: same no-op conditions, same cut rules (>=
versus >, min_keep), same float32 arithmetic, same effect on the `sorted` flag. Where this
code departs from llama.cpp it says so in the class docstring.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Mapping

import numpy as np

from .candidates import F32, Candidates, logf, logf_scalar, order_desc, seq_sum_f32
from .params import check_float, check_int, check_unit


class Sampler:
    """One step of a chain: `apply` edits the candidates, `accept` sees each chosen token."""

    name = "sampler"

    def apply(self, cur: Candidates) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        """Record a token that was emitted (most samplers keep no history)."""

    def reset(self) -> None:
        """Forget the history (and restart the random stream, for Dist)."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class LogitBias(Sampler):
    """llama_sampler_init_logit_bias: add a fixed bias to the logits of some tokens.

    A bias may be -inf (ban the token); NaN and +inf are refused. Unlike llama.cpp we clear
    `sorted` when a bias was applied, since the order may no longer hold.
    """

    name = "logit-bias"

    def __init__(self, n_vocab: int, biases: Mapping[int, float]) -> None:
        self.n_vocab = check_int("LogitBias n_vocab", n_vocab, 1)
        if not isinstance(biases, Mapping):
            raise ValueError("logit_bias must be a mapping of token id to bias, "
                             f"got {type(biases).__name__}")
        tokens, values = [], []
        for token, bias in biases.items():
            token = check_int("logit_bias token id", token)
            if not 0 <= token < self.n_vocab:
                raise ValueError(f"logit_bias token id {token} is out of range [0, {self.n_vocab})")
            tokens.append(token)
            values.append(check_float(f"logit_bias[{token}]", bias, allow_neg_inf=True))
        self.biases = dict(zip(tokens, values))
        self._tokens = np.array(tokens, dtype=np.int64)
        self._values = np.array(values, dtype=F32)

    def apply(self, cur: Candidates) -> None:
        if len(self._tokens) == 0:
            return
        if cur.in_id_order(self.n_vocab):  # first in the chain: token t sits at index t
            logits = cur.logits.copy()
            # the ids are a mapping's integer keys, so all different: one indexed add (np.add.at
            # would also add repeats, at several times the cost right after a decode)
            logits[self._tokens] += self._values
            cur.logits = logits
            cur.sorted = False
            return
        pos = cur.positions(self._tokens)
        found = pos >= 0
        if found.any():
            logits = cur.logits.copy()
            logits[pos[found]] += self._values[found]
            cur.logits = logits
            cur.sorted = False


class Penalties(Sampler):
    """llama_sampler_init_penalties: repetition, frequency and presence penalties.

    The last `last_n` accepted tokens are kept in a ring buffer with their counts. A
    candidate seen `count` > 0 times gets `logit / repeat` if its logit is > 0, else
    `logit * repeat`, then `- count * freq - present`. `last_n == 0` disables the sampler;
    llama.cpp's `-1` ("the whole context") must be resolved by the caller.
    """

    name = "penalties"

    def __init__(self, last_n: int = 64, repeat: float = 1.0, freq: float = 0.0,
                 present: float = 0.0) -> None:
        self.last_n = check_int("repeat_last_n", last_n, 0)
        self.repeat = check_float("repeat_penalty", repeat)
        if self.repeat <= 0.0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat}")
        self.freq = check_float("frequency_penalty", freq)
        self.present = check_float("presence_penalty", present)
        self._ring: deque[int] = deque(maxlen=max(self.last_n, 1))
        self._counts: dict[int, int] = {}

    @property
    def enabled(self) -> bool:
        neutral = self.repeat == 1.0 and self.freq == 0.0 and self.present == 0.0
        return self.last_n > 0 and not neutral

    @property
    def counts(self) -> dict[int, int]:
        """Occurrences of each token among the last `last_n` accepted."""
        return dict(self._counts)

    def accept(self, token: int) -> None:
        if self.last_n == 0:
            return
        self._counts[token] = self._counts.get(token, 0) + 1
        if len(self._ring) >= self.last_n:
            old = self._ring[0]  # the deque drops it on append
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        self._ring.append(token)

    def reset(self) -> None:
        self._ring.clear()
        self._counts.clear()

    def apply(self, cur: Candidates) -> None:
        if not self.enabled:
            return
        if self._counts:
            tokens = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.int64, count=len(self._counts))
            pos = cur.positions(tokens)
            found = pos >= 0
            pos, counts = pos[found], counts[found]
            logit = cur.logits[pos]
            logit = np.where(logit <= 0, logit * F32(self.repeat), logit / F32(self.repeat))
            present = (counts > 0).astype(F32) * F32(self.present)
            logit -= counts.astype(F32) * F32(self.freq) + present
            logits = cur.logits.copy()
            logits[pos] = logit
            cur.logits = logits
        cur.sorted = False


class TopK(Sampler):
    """llama_sampler_init_top_k: keep the k largest logits, sorted. k <= 0 disables it."""

    name = "top-k"

    def __init__(self, k: int) -> None:
        self.k = check_int("top_k", k)

    def apply(self, cur: Candidates) -> None:
        if self.k <= 0:
            return
        k = min(self.k, len(cur))
        if cur.sorted:
            cur.truncate(k)
        else:
            cur.sort_top(k)


class TopP(Sampler):
    """llama_sampler_init_top_p: keep the smallest prefix (by probability, descending)
    whose float32 cumulative sum reaches p, and at least min_keep. p = 1 disables it.

    Leaves the candidates sorted and `probs` holding the softmax over the candidates as they
    were before the cut (not renormalised), like llama.cpp. Unsorted candidates are ranked
    256 first, as llama.cpp does, then 16 times more each time p is not reached (llama.cpp
    sorts everything then), which gives the same cut with less sorting.
    """

    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = check_unit("top_p", p)
        self.min_keep = check_int("min_keep", min_keep, 0)

    def apply(self, cur: Candidates) -> None:
        p = F32(self.p)
        if p >= 1.0:
            return
        cur.softmax(do_sort=False)
        size = len(cur)
        order = None
        if cur.sorted:
            last = self._cut(cur.probs, p)
        else:
            # rank the best 256 first (llama.cpp's heuristic) and widen until p is reached;
            # a longer ranked prefix starts with the shorter one, so the cut is the same
            k = 256 if size > 1024 else size
            while True:
                order = order_desc(cur.logits, k)
                last = self._cut(cur.probs[order], p)
                if last is not None or k >= size:
                    break
                k = min(16 * k, size)
        if last is None:
            last = size
        if order is None:
            cur.truncate(last)
        else:
            cur.take(order[:last])
            cur.sorted = True

    def _cut(self, probs: np.ndarray, p: np.float32) -> int | None:
        """1 + the first i with cumsum >= p and i + 1 >= min_keep, or None.

        The probabilities are >= 0, so the float32 running sum never decreases and the first
        i it reaches p at is a binary search (two numpy calls where the masks took six, each
        costly right after a decode); a NaN (which breaks the order) takes the masks."""
        if len(probs) == 0:
            return None
        cum = np.cumsum(probs, dtype=F32)
        if cum[-1] == cum[-1]:
            hit = max(int(np.searchsorted(cum, p, side="left")), self.min_keep - 1)
            return hit + 1 if hit < len(cum) else None
        ok = (cum >= p) & (np.arange(1, len(cum) + 1) >= self.min_keep)
        hit = int(np.argmax(ok))
        return hit + 1 if ok[hit] else None


class MinP(Sampler):
    """llama_sampler_init_min_p: keep tokens whose probability is at least p times the
    largest one, i.e. logit >= max_logit + logf(p); at least min_keep. p = 0 disables it.

    Unsorted candidates are filtered in place (order kept, still unsorted); when that keeps
    fewer than min_keep, or the candidates are sorted, the sorted prefix rule is used.
    """

    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = check_unit("min_p", p)
        self.min_keep = check_int("min_keep", min_keep, 0)

    def apply(self, cur: Candidates) -> None:
        if F32(self.p) <= 0.0 or len(cur) == 0:
            return
        log_p = logf_scalar(self.p)
        if not cur.sorted:
            min_logit = cur.logits.max() + log_p
            keep = np.flatnonzero(cur.logits >= min_logit)
            if len(keep) and len(keep) >= self.min_keep:
                cur.take(keep)
                return
            cur.sort_top(len(cur))
        min_logit = cur.logits[0] + log_p
        cur.truncate(self._sorted_cut(cur.logits, min_logit))

    def _sorted_cut(self, logits: np.ndarray, min_logit: np.float32) -> int:
        """The first i >= max(1, min_keep) with logits[i] < min_logit, else len(logits).

        Sorted descending, the logits below min_logit are a tail: its start is a binary search
        on the negated row (ascending). Sorted rows hold a NaN only at their end (order_desc
        ranks it last); such a row takes the masks."""
        n = len(logits)
        if n and logits[-1] == logits[-1]:
            first = int(np.searchsorted(-logits, -min_logit, side="right"))
            return min(max(first, 1, self.min_keep), n)
        rest = np.arange(1, n)
        stop = (logits[1:] < min_logit) & (rest >= self.min_keep)
        return int(rest[np.argmax(stop)]) if stop.any() else n


class Typical(Sampler):
    """llama_sampler_init_typical: locally typical sampling.

    Sorts, computes the entropy H of the softmax, orders tokens by |-log p - H| ascending
    and keeps the shortest such prefix whose probability sum exceeds p (strictly), and at
    least min_keep. p = 1 disables it. The result is left unsorted with the pre-cut probs.
    Departure: a probability that underflows to 0 adds 0 to the entropy (llama.cpp would
    add 0 * log 0 = NaN and lose the order); such tokens rank last.
    """

    name = "typical"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = check_unit("typical_p", p)
        self.min_keep = check_int("min_keep", min_keep, 0)

    def apply(self, cur: Candidates) -> None:
        p = F32(self.p)
        if p >= 1.0:
            return
        cur.softmax(do_sort=True)
        log_probs = logf(cur.probs)
        with np.errstate(invalid="ignore"):
            terms = np.where(cur.probs > 0, -cur.probs * log_probs, F32(0.0)).astype(F32)
        entropy = seq_sum_f32(terms)
        shifted = np.abs(-log_probs - entropy)
        order = np.argsort(shifted, kind="stable")
        cum = np.cumsum(cur.probs[order], dtype=F32)
        ok = (cum > p) & (np.arange(len(cum)) >= self.min_keep - 1)
        hit = int(np.argmax(ok))
        last = hit + 1 if ok[hit] else len(cum)
        cur.take(order[:last])
        cur.sorted = False


def _temperature(cur: Candidates, temp: np.float32) -> None:
    """llama_sampler_temp_impl: divide logits by temp; temp <= 0 keeps only the first max."""
    if temp <= 0.0:
        best = int(np.argmax(cur.logits))
        logits = np.full(len(cur), -np.inf, dtype=F32)
        logits[best] = cur.logits[best]
        cur.logits = logits
        return
    cur.logits = cur.logits / temp


class Temperature(Sampler):
    """llama_sampler_init_temp: logits / t. t <= 0 sets every logit but the (first) largest
    to -inf, which makes any later pick greedy. The sorted flag is left as it was."""

    name = "temp"

    def __init__(self, t: float) -> None:
        self.t = check_float("temperature", t)

    def apply(self, cur: Candidates) -> None:
        _temperature(cur, F32(self.t))


class TemperatureExt(Sampler):
    """llama_sampler_init_temp_ext: dynamic temperature (what llama.cpp's CLI chain uses).

    With delta > 0 the temperature moves within [max(0, t - delta), t + delta] with the
    normalised entropy of the candidates raised to `exponent`; with delta = 0 it is
    `Temperature(t)`.
    """

    name = "temp-ext"

    def __init__(self, t: float, delta: float = 0.0, exponent: float = 1.0) -> None:
        self.t = check_float("temperature", t)
        self.delta = check_float("dynatemp_range", delta)
        if self.delta < 0:
            raise ValueError(f"dynatemp_range must be >= 0, got {self.delta}")
        self.exponent = check_float("dynatemp_exponent", exponent)

    def apply(self, cur: Candidates) -> None:
        t, delta = F32(self.t), F32(self.delta)
        if delta <= 0:
            _temperature(cur, t)
            return
        if len(cur) <= 1:
            return
        min_temp = max(F32(0.0), F32(t - delta))
        max_temp = F32(t + delta)
        max_entropy = -logf_scalar(F32(1.0) / F32(len(cur)))
        cur.softmax(do_sort=True)
        positive = cur.probs > 0
        log_probs = logf(np.where(positive, cur.probs, F32(1.0)))
        terms = np.where(positive, cur.probs * log_probs, F32(0.0)).astype(F32)
        entropy = -seq_sum_f32(terms)
        normalized = F32(entropy / max_entropy)
        power = F32(math.pow(float(normalized), float(F32(self.exponent))))
        dyn = F32(min_temp + (max_temp - min_temp) * power)
        _temperature(cur, dyn)
        # llama.cpp renormalises here in double precision
        p64 = np.exp(cur.logits.astype(np.float64) - float(cur.logits[0]))
        total = float(np.cumsum(p64)[-1])
        cur.probs = (p64.astype(F32).astype(np.float64) / total).astype(F32)


class TopNSigma(Sampler):
    """llama_sampler_init_top_n_sigma(n): mask (-inf) every logit below max - n * sigma, the
    mean and standard deviation taken over the finite-or-+inf logits. n <= 0 disables it.

    The mean is llama.cpp's float sum over a float count; its deviation sums the squares in
    double and rounds once, where llama.cpp rounds its float accumulator at every step, so a
    logit within float rounding of the cut may land on the other side."""

    name = "top-n-sigma"

    def __init__(self, n: float) -> None:
        self.n = check_float("top_n_sigma", n)

    def apply(self, cur: Candidates) -> None:
        n = F32(self.n)
        if n <= 0.0 or len(cur) <= 1:
            return
        logits = cur.logits
        valid = logits[logits != -np.inf]
        if len(valid) == 0:
            return
        top = F32(max(valid.max(), logits[0]))
        mean = F32(seq_sum_f32(valid) / F32(len(valid)))
        dev = (valid - mean).astype(np.float64)            # float differences, squared exactly
        variance = F32(F32(np.cumsum(dev * dev)[-1]) / F32(len(valid)))
        sigma = F32(math.sqrt(float(variance)))             # a float sqrt, correctly rounded
        cut = F32(top - F32(n * sigma))
        cur.logits = np.where(logits < cut, F32(-np.inf), logits).astype(F32)
