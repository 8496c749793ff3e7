"""The reasoning budget (llama/sampling/reasoning_budget.py) step by step, as llama.cpp's
state machine (common/reasoning-budget.cpp) walks: tokens are ids of a 10-token vocabulary
whose texts are below; the start marker "<t>", the end marker "</t>", and " ok" then "</t>"
forced when the budget runs out."""
from __future__ import annotations

import numpy as np

from llama.sampling.reasoning_budget import BudgetState, ReasoningBudget

PIECES = {0: b"?", 1: b"<t", 2: b">", 3: b"</t>", 4: b" ok", 5: b" a", 6: b" b", 7: b"\n", 8: b" c", 9: b"x"}
FORCED = [4, 3]


def make(budget: int, prompt: list[int], opened: bool, **kw) -> tuple[ReasoningBudget, list[int]]:
    pieces = {**PIECES, **kw.pop("pieces", {})}
    return ReasoningBudget("<t>", "</t>", FORCED, budget, lambda t: pieces[t], n_prompt=len(prompt),
                           opened=opened), list(prompt)


def run(budget: ReasoningBudget, ids: list[int], picks: list[int], steps: int) -> list[int]:
    """Generate `steps` tokens: the forced one when only one is allowed, else the next of
    `picks` (then " a" for ever)."""
    out, picks = [], list(picks)
    for _ in range(steps):
        scores = budget(np.array(ids), np.zeros(10, np.float32))
        allowed = np.flatnonzero(np.isfinite(scores))
        token = int(allowed[0]) if len(allowed) == 1 else (picks.pop(0) if picks else 5)
        ids.append(token)
        out.append(token)
    return out


def test_the_budget_forces_the_message_and_the_end_marker():
    budget, ids = make(3, [9, 1, 2], opened=True)
    assert run(budget, ids, [], 7) == [5, 5, 5, 4, 3, 5, 5]
    assert budget.state == BudgetState.DONE


def test_a_natural_end_stops_the_count():
    budget, ids = make(3, [1, 2], opened=True)
    assert run(budget, ids, [6, 3], 6) == [6, 3, 5, 5, 5, 5]


def test_counting_starts_when_the_model_opens_the_block():
    """The marker's text is found across tokens ("<t" then ">")."""
    budget, ids = make(2, [9], opened=False)
    assert run(budget, ids, [7, 1, 2], 7) == [7, 1, 2, 5, 5, 4, 3]


def test_budget_zero_forces_at_once_and_a_new_block_counts_again():
    budget, ids = make(0, [1, 2], opened=True)
    assert run(budget, ids, [], 2) == [4, 3]
    again, ids = make(1, [1, 2], opened=True)
    assert run(again, ids, [6, 5, 1, 2, 8], 8) == [6, 4, 3, 5, 1, 2, 8, 4]


def test_forcing_waits_for_a_whole_character():
    split = "é".encode()
    budget, ids = make(1, [1, 2], opened=True, pieces={6: split[:1], 7: split[1:]})
    assert run(budget, ids, [6, 7], 4) == [6, 7, 4, 3]
