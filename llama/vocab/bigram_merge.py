"""The bigram merge loop BPE and SPM share: llama.cpp's priority queue over a linked list
of symbols. The two differ only in how a pair ranks and how a stale entry shows, so each
passes those in and this loop does the rest.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable

# (heap key, check) for a pair that may merge, None for one that may not
RankFn = Callable[[str, str], "tuple[Any, Any] | None"]
# whether a popped entry still describes its two (non-empty) sides, from its check
FreshFn = Callable[[str, str, Any], bool]


def merge_bigrams(symbols: list[str], rank: RankFn, fresh: FreshFn) -> list[str]:
    """Merge the lowest-keyed adjacent pair until none may merge; the merged symbols.

    Heap entries are (key, left index, right index, check): ties go to the leftmost pair,
    as in llama.cpp. An entry is skipped when a side has been merged away (empty) or
    `fresh` says a side has changed since it was pushed.
    """
    text = list(symbols)
    n = len(text)
    if n < 2:
        return text
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[Any, int, int, Any]] = []

    def push(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        ranked = rank(text[left], text[right])
        if ranked is not None:
            heapq.heappush(heap, (ranked[0], left, right, ranked[1]))

    for i in range(1, n):
        push(i - 1, i)
    while heap:
        _, left, right, check = heapq.heappop(heap)
        lt, rt = text[left], text[right]
        if not lt or not rt or not fresh(lt, rt, check):
            continue
        text[left] = lt + rt
        text[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] != -1:
            prv[nxt[right]] = left
        push(prv[left], left)
        push(left, nxt[left])
    return [t for t in text if t]
