"""The candidate list the samplers work on, and the float32 arithmetic they share.

`Candidates` is llama.cpp's `llama_token_data_array` laid out as three parallel numpy arrays
(`ids`, `logits`, `probs`) plus the `sorted` flag and the `selected` index. A sampler shrinks
or reorders the arrays (`take`, `truncate`) instead of moving structs around.

llama.cpp computes in float32 with glibc's `expf`/`logf` and sums in a plain loop. Picks made
by `Dist` and the cut points of top-p/typical depend on those exact bits, so the helpers here
reproduce them: `expf`/`logf` evaluate in float64 and round once to float32 (glibc's float
functions are correctly rounded in all but vanishingly rare cases; numpy's own float32 `exp`
is up to 2 ulp off), and `seq_sum_f32` accumulates left to right in float32 like a C loop
(numpy's `sum` is pairwise, so it would round differently).

Ties: llama.cpp sorts with `std::partial_sort`, whose order among equal logits is unspecified.
Here equal logits keep their current relative order (earlier candidate first), which makes
every result deterministic.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .top_k_native import top_k_indices

F32 = np.float32
_BLOCK = 256
# order_desc takes the native pass for up to this many of a row (top-k's 40): it keeps them
# in a sorted buffer, so a large n (top-p's 256 first ranks of an unsorted row) is numpy's
NATIVE_MAX_N = 128


def expf(x: np.ndarray) -> np.ndarray:
    """float32 exp with glibc's rounding (see the module docstring)."""
    return np.exp(np.asarray(x, dtype=np.float64)).astype(F32)


def logf(x: np.ndarray) -> np.ndarray:
    """float32 log with glibc's rounding; log(0) is -inf without a warning."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(x, dtype=np.float64)).astype(F32)


def logf_scalar(v: float) -> np.float32:
    """`logf` of one float32 value (`logf(0.05f)` in the C code); log(0) is -inf."""
    v32 = float(F32(v))
    return F32(math.log(v32)) if v32 > 0.0 else F32(-np.inf)


def seq_sum_f32(x: np.ndarray) -> np.float32:
    """`float s = 0; for (...) s += x[i];`: a left-to-right float32 sum."""
    if len(x) == 0:
        return F32(0.0)
    return np.cumsum(x, dtype=F32)[-1]


def _order_desc_direct(logits: np.ndarray, n: int) -> np.ndarray:
    size = len(logits)
    if n < size:
        part = np.argpartition(logits, size - n)[size - n:]
        # argpartition picks an arbitrary subset among logits equal to the n-th largest;
        # take the earliest ones so the result does not depend on numpy's internals
        threshold = logits[part].min()
        if np.count_nonzero(logits >= threshold) > n:
            above = np.flatnonzero(logits > threshold)
            ties = np.flatnonzero(logits == threshold)[: n - len(above)]
            part = np.concatenate([above, ties])
        idx = np.sort(part)
    else:
        idx = np.arange(size)
    return idx[np.argsort(-logits[idx], kind="stable")]


def order_desc(logits: np.ndarray, n: int) -> np.ndarray:
    """Indices of the `n` largest logits, largest first; ties keep the earlier index first.

    For a small `n` (top-40 of 262,144) one native pass keeps the best (top_k_native.py);
    otherwise the maxima of blocks of 256 give a threshold that at least `n` logits reach,
    so only the few logits above it are ranked: about one pass over the row instead of a
    partition of all of it.
    """
    size = len(logits)
    n = min(n, size)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if n <= NATIVE_MAX_N and size >= 4 * n and logits.dtype == F32 and logits.flags.c_contiguous:
        # one native pass (top_k_native.py); None: the row holds a NaN, ranked below
        idx = top_k_indices(logits, n)
        if idx is not None:
            return idx
    n_blocks = size // _BLOCK
    if n_blocks > 4 * n:
        block_max = logits[: n_blocks * _BLOCK].reshape(n_blocks, _BLOCK).max(axis=1)
        threshold = np.partition(block_max, n_blocks - n)[n_blocks - n]
        cand = np.flatnonzero(logits >= threshold)  # every one of the top n is in here
        return cand[_order_desc_direct(logits[cand], n)]
    return _order_desc_direct(logits, n)


@functools.lru_cache(maxsize=4)
def _id_range(n: int) -> np.ndarray:
    ids = np.arange(n, dtype=np.int32)
    ids.flags.writeable = False
    return ids


@functools.lru_cache(maxsize=8)
def _zero_probs(n: int) -> np.ndarray:
    """The probabilities of fresh candidates (none computed yet), shared read-only: the
    samplers assign new arrays, so one zero row per vocabulary size serves every step."""
    probs = np.zeros(n, dtype=F32)
    probs.flags.writeable = False
    return probs


class Candidates:
    """llama_token_data_array: candidate ids with their logits and probabilities.

    `probs` holds whatever the last sampler that computed probabilities wrote (like `p` in
    llama.cpp, it is not refreshed when logits change); `selected` is an index into the
    arrays (not a token id), -1 until a selecting sampler ran. The arrays are treated as
    immutable: a sampler assigns new arrays instead of editing them in place.
    """

    __slots__ = ("ids", "logits", "probs", "sorted", "selected")

    def __init__(self, ids: np.ndarray, logits: np.ndarray, probs: np.ndarray | None = None,
                 sorted: bool = False, selected: int = -1) -> None:
        self.ids = np.asarray(ids, dtype=np.int32)
        self.logits = np.asarray(logits, dtype=F32)
        if probs is None:
            probs = np.zeros(len(self.ids), dtype=F32)
        self.probs = np.asarray(probs, dtype=F32)
        if not (len(self.ids) == len(self.logits) == len(self.probs)):
            raise ValueError("Candidates: ids, logits and probs must have the same length, got "
                             f"{len(self.ids)}, {len(self.logits)}, {len(self.probs)}")
        self.sorted = sorted
        self.selected = selected

    @classmethod
    def from_logits(cls, logits: np.ndarray) -> Candidates:
        """All tokens of a logits row, in id order.

        Samplers replace arrays rather than write into them, so the row is not copied; it is
        wrapped read-only so that a stray in-place write fails instead of changing the
        caller's logits.
        """
        row = np.asarray(logits, dtype=F32).view()
        row.flags.writeable = False
        n = len(row)
        # the three arrays are right by construction: skip __init__'s conversions and checks,
        # which cost more than the sampling itself right after a decode (cold caches)
        cur = cls.__new__(cls)
        cur.ids, cur.logits, cur.probs = _id_range(n), row, _zero_probs(n)
        cur.sorted, cur.selected = False, -1
        return cur

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def selected_id(self) -> int:
        """The token id at `selected`."""
        if not 0 <= self.selected < len(self.ids):
            raise IndexError(f"no candidate is selected (selected={self.selected}, "
                             f"size={len(self.ids)})")
        return int(self.ids[self.selected])

    def take(self, index: np.ndarray) -> None:
        """Keep the candidates at `index`, in that order."""
        self.ids = self.ids[index]
        self.logits = self.logits[index]
        self.probs = self.probs[index]

    def truncate(self, n: int) -> None:
        """Keep the first `n` candidates (`cur_p->size = n`)."""
        self.ids = self.ids[:n]
        self.logits = self.logits[:n]
        self.probs = self.probs[:n]

    def sort_top(self, n: int) -> None:
        """llama_token_data_array_partial_sort_inplace: keep the `n` best, sorted descending."""
        self.take(order_desc(self.logits, n))
        self.sorted = True

    def in_id_order(self, n_vocab: int) -> bool:
        """Whether these are still all n_vocab tokens in id order (as `from_logits` made
        them), so that token t sits at index t: one identity check, no pass over the ids."""
        return len(self.ids) == n_vocab and self.ids is _id_range(n_vocab)

    def positions(self, tokens: np.ndarray) -> np.ndarray:
        """Index of each token id among the candidates, -1 where it is not a candidate.

        Fast path as in llama.cpp's logit-bias sampler: while the candidates are still in id
        order, token t sits at index t. Other tokens are found through a sorted copy of ids.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        pos = np.full(len(tokens), -1, dtype=np.int64)
        size = len(self.ids)
        in_range = np.flatnonzero((tokens >= 0) & (tokens < size))
        direct = in_range[self.ids[tokens[in_range]] == tokens[in_range]]
        pos[direct] = tokens[direct]
        missing = np.flatnonzero(pos < 0)
        if len(missing) and size:
            order = np.argsort(self.ids, kind="stable")
            sorted_ids = self.ids[order]
            j = np.minimum(np.searchsorted(sorted_ids, tokens[missing]), size - 1)
            hit = sorted_ids[j] == tokens[missing]
            pos[missing[hit]] = order[j[hit]]
        return pos

    def softmax(self, do_sort: bool) -> None:
        """llama_sampler_softmax_impl: probs = softmax(logits), optionally sorting first."""
        if len(self.ids) == 0:
            raise ValueError("softmax of an empty candidate list")
        if do_sort and not self.sorted:
            self.sort_top(len(self.ids))
        max_l = self.logits[0] if self.sorted else self.logits.max()
        p = expf(self.logits - max_l)
        self.probs = p / seq_sum_f32(p)

    def __repr__(self) -> str:
        return f"Candidates(size={len(self.ids)}, sorted={self.sorted}, selected={self.selected})"
