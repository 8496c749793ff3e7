"""Checking a draft: sample the rows of [pending, *draft] in turn while they agree."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np

if TYPE_CHECKING:   # llama.api imports this module
    from llama.api.sequence import Sequence, Step


def accept(seq: Sequence, rows: np.ndarray, draft: Seq[int]) -> tuple[list[Step], int]:
    """Step `seq` on `rows` (the logits after each token of [pending, *draft], so
    len(rows) == len(draft) + 1) while each sampled token equals the draft's next one.

    Returns the steps taken (at least one) and how many draft tokens the cache keeps: those
    sampled and matched before the last step. The last step's token is the new pending one,
    not decoded yet, exactly as after a decode without a draft (a matched draft token that
    ended the sequence is not kept either: nothing would read it)."""
    if len(rows) != len(draft) + 1:
        raise ValueError(f"{len(rows)} logits rows for a draft of {len(draft)} tokens")
    steps = []
    for i, row in enumerate(rows):
        step = seq.step(row)
        steps.append(step)
        if seq.finished or i == len(draft) or step.token != draft[i]:
            return steps, i
    raise AssertionError("unreachable")


def draft_budget(n_max: int, *, n_past: int, n_ctx: int, n_remaining: int) -> int:
    """How many tokens a draft may have (llama-server's get_n_draft_max): the pending token
    and the draft must fit the context with a position to spare, and a fully accepted
    draft plus the token sampled after it must not pass the sequence's max_tokens."""
    return max(0, min(n_max, n_ctx - n_past - 2, n_remaining - 1))

