"""The next-token mask of an llguidance matcher, computed now or in a background thread.

llguidance computes a mask without the GIL (`LLMatcher.unsafe_compute_mask_ptr` drops it
for the whole computation), and our decode spends most of its time in native code that
drops it too. So the mask for step i+1 can be computed while the decode of token i runs:
`start()` right after the token is consumed, `get()` when the logits are there. Only one
thread touches the matcher at a time: every other use of it must `settle()` first.

The mask is a bool per token id plus the allowed ids (both made in the worker thread, off
the sampling path). End-of-generation tokens are allowed exactly when the matcher is
accepting (llguidance's own bits agree; we set them explicitly so the rule does not depend
on how a tokenizer marked its EOS ids).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance
import numpy as np


@dataclass(frozen=True)
class TokenMask:
    """The tokens allowed next: `allowed[t]` per token id, and `ids`, the allowed ids."""

    allowed: np.ndarray
    ids: np.ndarray


@dataclass
class MaskStats:
    """Where mask time went; `compute_s` may overlap the decode, `wait_s` does not."""

    masks: int = 0          # masks computed
    prefetched: int = 0     # of which were started ahead by prefetch
    compute_s: float = 0.0  # time llguidance spent computing them, on whichever thread
    wait_s: float = 0.0     # time the sampling thread was blocked waiting for a mask

    def per_mask_ms(self) -> dict[str, float]:
        n = max(self.masks, 1)
        return {"masks": self.masks, "prefetched": self.prefetched,
                "compute_ms": round(self.compute_s / n * 1e3, 4),
                "wait_ms": round(self.wait_s / n * 1e3, 4)}


class MaskComputer:
    """Owns the mask buffer of one matcher and, when prefetching, a worker thread."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int, eog_ids: np.ndarray) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._eog_ids = eog_ids
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[TokenMask] | None = None
        self._mask: TokenMask | None = None  # the mask of the matcher's current state
        self.stats = MaskStats()

    def _compute(self) -> TokenMask:
        t0 = time.perf_counter()
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")  # token 32w+i = bit i
        allowed = bits[: self._n_vocab].view(np.bool_)
        allowed[self._eog_ids] = self._matcher.is_accepting()
        allowed.flags.writeable = False
        mask = TokenMask(allowed, np.flatnonzero(allowed))
        self.stats.compute_s += time.perf_counter() - t0
        self.stats.masks += 1
        return mask

    def start(self) -> None:
        """Begin computing the current state's mask in the worker thread (if not known)."""
        if self._mask is not None or self._pending is not None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
        self.stats.prefetched += 1
        self._pending = self._executor.submit(self._compute)

    def settle(self) -> None:
        """Wait for a mask being computed in the background, so the matcher is free."""
        if self._pending is not None:
            t0 = time.perf_counter()
            pending, self._pending = self._pending, None
            self._mask = pending.result()
            self.stats.wait_s += time.perf_counter() - t0

    def get(self) -> TokenMask:
        """The mask of the current state, computing it here if needed."""
        self.settle()
        if self._mask is None:
            t0 = time.perf_counter()
            self._mask = self._compute()
            self.stats.wait_s += time.perf_counter() - t0
        return self._mask

    def invalidate(self) -> None:
        """The matcher is about to change: forget the mask (after any pending one ends)."""
        self.settle()
        self._mask = None

    def close(self) -> None:
        """Stop the worker thread (a later `start` creates a new one)."""
        self.settle()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
