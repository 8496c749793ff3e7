"""XTC, "exclude top choices" (llama_sampler_init_xtc): now and then, drop the most probable
candidates so that a less obvious one is picked, keeping the least probable of those above
the threshold.

It draws from a generator of its own, seeded like `Dist` (llama.cpp's common chain gives
both the request's seed, so with a fixed seed their two streams are the same sequence).
"""
from __future__ import annotations

import numpy as np

from .candidates import F32, Candidates
from .mt19937 import StdMT19937
from .params import check_float, check_int
from .pick import check_seed, resolve_seed
from .samplers import Sampler


class XTC(Sampler):
    """llama_sampler_init_xtc(p, t, min_keep, seed): with chance p (one float draw per step,
    uniform_real_distribution<float>) every candidate whose probability is at least t is
    removed but the least probable of them, if at least min_keep remain. p <= 0 or t > 0.5
    disables it (no draws). Leaves the candidates sorted, probs as the softmax before the cut."""

    name = "xtc"

    def __init__(self, probability: float, threshold: float, min_keep: int = 1,
                 seed: int | None = None) -> None:
        self.probability = check_float("xtc_probability", probability)
        self.threshold = check_float("xtc_threshold", threshold)
        self.min_keep = check_int("min_keep", min_keep, 0)
        self.seed = check_seed(seed)
        self.seed_cur = resolve_seed(self.seed)
        self._rng = StdMT19937(self.seed_cur)

    @property
    def enabled(self) -> bool:
        return F32(self.probability) > 0.0 and F32(self.threshold) <= 0.5

    def reset(self) -> None:
        self.seed_cur = resolve_seed(self.seed)
        self._rng.seed(self.seed_cur)

    def apply(self, cur: Candidates) -> None:
        if not self.enabled or len(cur) < 2:
            return
        if self._rng.uniform01_float() > F32(self.probability):
            return
        cur.softmax(do_sort=True)
        above = cur.probs >= F32(self.threshold)
        # llama.cpp's pos_last: the last of the leading run at or above t (0 when there is none)
        pos_last = len(cur) - 1 if above.all() else int(np.argmin(above)) - 1
        if pos_last > 0 and len(cur) - pos_last >= self.min_keep:
            cur.take(slice(pos_last, None))
