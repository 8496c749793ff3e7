"""The samplers that choose the token: `Dist` (seeded random draw) and `Greedy` (argmax)."""
from __future__ import annotations

import os

import numpy as np

from .candidates import F32, Candidates, expf
from .mt19937 import StdMT19937
from .params import check_int
from .samplers import Sampler

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp: "pick a random seed"


def _random_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def resolve_seed(seed: int) -> int:
    """llama.cpp's get_rng_seed: LLAMA_DEFAULT_SEED draws a fresh random seed, any other is itself
    (every seeded sampler resolves its seed at creation and at each reset)."""
    return _random_seed() if seed == LLAMA_DEFAULT_SEED else seed


def check_seed(seed: int | None) -> int:
    """A 32-bit seed; None and -1 mean LLAMA_DEFAULT_SEED (random)."""
    if seed is None:
        return LLAMA_DEFAULT_SEED
    seed = check_int("seed", seed)
    if seed == -1:
        return LLAMA_DEFAULT_SEED
    if not 0 <= seed <= 0xFFFFFFFF:
        raise ValueError(f"seed must be in [0, 2**32 - 1], or -1/None for a random seed, "
                         f"got {seed}")
    return seed


class Dist(Sampler):
    """llama_sampler_init_dist: draw a token from the softmax of the remaining logits.

    Bit-compatible with llama.cpp (CPU path, libstdc++ build): a `std::mt19937` seeded with
    `seed`; per pick, p_i = expf(logit_i - max) in float32, S = their double sum, one
    `uniform_real_distribution<double>` draw u, and the first i whose running double sum
    reaches S * u is selected. A single candidate is selected without drawing. `probs` ends
    up normalised (float32 p / double S).

    `seed=None`, -1 or 0xFFFFFFFF (LLAMA_DEFAULT_SEED) take a fresh random seed, at creation
    and at every `reset()`; `seed_cur` is the seed in use. Any other value must fit in 32
    bits. Raises ValueError if every remaining logit is -inf (nothing can be drawn).
    """

    name = "dist"

    def __init__(self, seed: int | None = None) -> None:
        self.seed = check_seed(seed)
        self.seed_cur = resolve_seed(self.seed)
        self._rng = StdMT19937(self.seed_cur)

    def reset(self) -> None:
        self.seed_cur = resolve_seed(self.seed)
        self._rng.seed(self.seed_cur)

    def apply(self, cur: Candidates) -> None:
        size = len(cur)
        if size == 0:
            cur.selected = -1
            return
        cur.selected = 0
        if size == 1:
            cur.probs = np.ones(1, dtype=F32)
            return
        max_l = cur.logits[0] if cur.sorted else cur.logits.max()
        if max_l == -np.inf:
            raise ValueError("dist: every candidate has logit -inf, there is nothing to draw from")
        p = expf(cur.logits - max_l).astype(np.float64)  # float32 values, summed in double
        running = np.cumsum(p)
        total = running[-1]
        target = total * self._rng.uniform01()
        selected = int(np.searchsorted(running, target, side="left"))
        cur.selected = min(selected, size - 1)
        cur.probs = (p / total).astype(F32)


class Greedy(Sampler):
    """llama_sampler_init_greedy: select the largest logit (the first one on ties)."""

    name = "greedy"

    def apply(self, cur: Candidates) -> None:
        cur.selected = int(np.argmax(cur.logits)) if len(cur) else -1
