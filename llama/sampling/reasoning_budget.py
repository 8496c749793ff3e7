"""llama.cpp's reasoning budget (common/reasoning-budget.cpp): at most `budget` tokens of
reasoning, then the end marker (after an optional message) is forced token by token.

A logits processor (`processor(input_ids, scores) -> scores`, as llama-cpp-python's): it
reads the generated tokens it has not seen yet (a generation prompt that opened the thinking
block starts the count at once) and walks llama.cpp's states:

- idle: watching for the start marker's tokens;
- counting: each reasoning token spends one of the budget; the end marker written by the
  model ends it (done); at zero, once the last token's text is whole UTF-8, forcing starts;
- forcing: every logit but the next forced token's is -inf, until all are written (done);
- done: a new start marker counts again.
"""
from __future__ import annotations

from enum import Enum
from typing import Callable, Sequence

import numpy as np


class BudgetState(Enum):
    IDLE = "idle"
    COUNTING = "counting"
    WAITING_UTF8 = "waiting_utf8"
    FORCING = "forcing"
    DONE = "done"


def _utf8_complete(piece: bytes) -> bool:
    """Whether `piece` does not end inside a UTF-8 character."""
    try:
        piece.decode("utf-8")
        return True
    except UnicodeDecodeError as e:
        return e.reason != "unexpected end of data"


class ReasoningBudget:
    def __init__(self, start: str, end: str, forced: Sequence[int], budget: int,
                 piece_of: Callable[[int], bytes], *, n_prompt: int = 0, opened: bool = False) -> None:
        """`start`, `end`: the markers' text, found in the text of the tokens (so a marker
        the tokenizer merged with its neighbours still counts); `forced`: the tokens forced
        when the budget runs out (a message's, then the end marker's); `piece_of`: a token's
        bytes. The first `n_prompt` tokens are the prompt, whose end `opened` the block or
        not (`opens_thinking`): counting starts at once when it did."""
        if not start or not end or not forced:
            raise ValueError("a reasoning budget needs start and end markers and forced tokens")
        self.start, self.end, self.forced = start.encode(), end.encode(), list(forced)
        self.budget = budget
        self.piece_of = piece_of
        self.state = BudgetState.IDLE
        self.remaining = budget
        self.force_pos = 0
        self._seen = n_prompt
        self._tail = b""   # the end of the text since the state last changed
        if opened:
            self._begin()

    def _matches(self, marker: bytes) -> bool:
        return self._tail.endswith(marker)

    def _begin(self) -> None:
        self.remaining = self.budget
        self.state = BudgetState.COUNTING if self.budget > 0 else BudgetState.FORCING
        self.force_pos = 0
        self._tail = b""

    def accept(self, token: int) -> None:
        piece = self.piece_of(token)
        self._tail = (self._tail + piece)[-(len(self.start) + len(self.end) + 8):]
        state = self.state
        if state in (BudgetState.IDLE, BudgetState.DONE):
            if self._matches(self.start):
                self._begin()
        elif state in (BudgetState.COUNTING, BudgetState.WAITING_UTF8):
            if self._matches(self.end):
                self.state = BudgetState.DONE
                self._tail = b""
                return
            if state == BudgetState.COUNTING:
                self.remaining -= 1
                if self.remaining > 0:
                    return
            if _utf8_complete(piece):
                self.state, self.force_pos = BudgetState.FORCING, 0
            else:
                self.state = BudgetState.WAITING_UTF8
        elif state == BudgetState.FORCING:
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state = BudgetState.DONE
                self._tail = b""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for token in input_ids[self._seen:]:
            self.accept(int(token))
        self._seen = len(input_ids)
        if self.state != BudgetState.FORCING or self.force_pos >= len(self.forced):
            return scores
        forced = self.forced[self.force_pos]
        out = np.full_like(scores, -np.inf)
        out[forced] = scores[forced] if np.isfinite(scores[forced]) else 0.0   # forced even if banned before
        return out
