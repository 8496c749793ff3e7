"""Drafters that need no second model: guesses from the sequence's own history.

A drafter's one method, `draft(seq_id, history, n_max)`, returns at most `n_max` tokens it
expects after `history` (the prompt and the generated tokens, the pending one included).
`seq_id` lets a drafter with per-sequence state (a draft model's cache) keep sequences
apart; the history is always complete, so a drafter may also ignore it.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Callable, Sequence as Seq

import numpy as np

if TYPE_CHECKING:
    from llama.api.engine import Engine


class Drafter(abc.ABC):
    """What the decoders call (`Llama`'s run loop, the server's slots)."""

    @abc.abstractmethod
    def draft(self, seq_id: int, history: Seq[int], n_max: int) -> list[int]:
        """At most n_max tokens expected after `history` (possibly none)."""


class LlamaDraftModel(abc.ABC):
    """llama-cpp-python's interface for `Llama(draft_model=...)`: called with the token ids so
    far (numpy intc), returns the draft's token ids."""

    @abc.abstractmethod
    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        """The ids the model expects after input_ids (possibly none)."""


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """llama-cpp-python's prompt lookup: the tokens that followed the earliest earlier
    occurrence of the history's last n-gram (n from `max_ngram_size` down to 1), at most
    `num_pred_tokens` of them. Pays off where the output repeats the prompt (code edits,
    quotes, extraction)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        if max_ngram_size < 1 or num_pred_tokens < 0:
            raise ValueError(f"max_ngram_size must be >= 1 and num_pred_tokens >= 0, "
                             f"got {max_ngram_size} and {num_pred_tokens}")
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens

    @staticmethod
    def find_candidate_pred_tokens(input_ids: np.ndarray, max_ngram_size: int,
                                   num_pred_tokens: int) -> np.ndarray:
        n = input_ids.shape[0]
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(input_ids, (size,))
            matches = np.nonzero(np.all(windows == input_ids[-size:], axis=1))[0]
            for idx in matches:
                start = idx + size
                end = min(start + num_pred_tokens, n)
                if start < end:
                    return input_ids[start:end]
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        return self.find_candidate_pred_tokens(np.asarray(input_ids, dtype=np.intc),
                                               self.max_ngram_size, self.num_pred_tokens)


class NgramSimple(Drafter):
    """llama.cpp's `ngram-simple`: the history's last `size_n` tokens are looked up at their
    latest earlier occurrence (never at position 0), and up to `size_m` tokens that followed
    it are the draft; nothing until the history is longer than size_n + size_m + 1, and
    nothing when fewer than size_n tokens follow the match (llama.cpp's common/ngram-map)."""

    def __init__(self, size_n: int = 12, size_m: int = 48):
        if size_n < 1 or size_m < 1:
            raise ValueError(f"ngram sizes must be >= 1, got n={size_n}, m={size_m}")
        self.size_n, self.size_m = size_n, size_m

    def draft(self, seq_id: int, history: Seq[int], n_max: int) -> list[int]:
        n, m = self.size_n, self.size_m
        tokens = np.asarray(history[:-1], dtype=np.int64)   # llama.cpp's prompt; history[-1] is its `sampled`
        length = len(tokens)
        if n_max <= 0 or length <= n + m + 1:
            return []
        pattern = np.asarray(history[-n:], dtype=np.int64)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[1:length - 1], n)   # j = 1 .. L-n-1
        hits = np.nonzero(np.all(windows == pattern, axis=1))[0]
        if not len(hits):
            return []
        start = int(hits[-1]) + 1 + n
        count = min(m, length - start)
        if count < n:
            return []
        return [int(t) for t in tokens[start:start + min(count, n_max)]]


class CallableDrafter(Drafter):
    """A llama-cpp-python draft model (any callable of the ids so far) as a Drafter."""

    def __init__(self, fn: Callable[[np.ndarray], Seq[int]]):
        self.fn = fn

    def draft(self, seq_id: int, history: Seq[int], n_max: int) -> list[int]:
        if n_max <= 0:
            return []
        out = self.fn(np.asarray(history, dtype=np.intc))
        return [int(t) for t in np.asarray(out).reshape(-1)[:n_max]]


class FirstOf(Drafter):
    """Several drafters in order of preference: the first non-empty draft is used
    (llama.cpp's list of speculative types: n-gram lookups before a draft model)."""

    def __init__(self, drafters: list[Drafter]):
        self.drafters = list(drafters)

    def draft(self, seq_id: int, history: Seq[int], n_max: int) -> list[int]:
        for drafter in self.drafters:
            out = drafter.draft(seq_id, history, n_max)
            if out:
                return out[:n_max]
        return []


class TargetDraft(abc.ABC):
    """A drafter to be made for the target it drafts for (a draft model file whose context
    matches the target's, Gemma 4's assistant reading the target's cache): what
    `Llama(draft_model=...)` takes where the target does not exist yet."""

    @abc.abstractmethod
    def bind(self, target: "Engine") -> Drafter:
        """The drafter for the sequences of `target`."""


def as_drafter(draft_model: object, target: "Engine | None" = None) -> Drafter:
    """`Llama(draft_model=...)`: a Drafter as it is, a TargetDraft made for `target`, a
    callable (llama-cpp-python's LlamaDraftModel, or any function of the ids) wrapped;
    anything else is refused."""
    if isinstance(draft_model, Drafter):
        return draft_model
    if isinstance(draft_model, TargetDraft):
        if target is None:
            raise ValueError(f"{type(draft_model).__name__} is made for a target: give its engine")
        return draft_model.bind(target)
    if callable(draft_model):
        return CallableDrafter(draft_model)  # type: ignore[arg-type]
    raise TypeError(f"draft_model must be a callable of the token ids (llama-cpp-python's LlamaDraftModel), "
                    f"a Drafter or a TargetDraft, got {type(draft_model).__name__}")
