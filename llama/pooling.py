"""Pooled embeddings, as llama.cpp's pooling types (`{arch}.pooling_type`, build_pooling).

An embeddings context (`Context(embeddings=True)`) gets every token's final normed hidden
state (llama.cpp's `t_embd`) from its graph and pools them here, on the host, per sequence.
Pooling on the host keeps one graph for every pooling type and works over the whole batch,
so a sequence split across ubatches pools over all its tokens (llama.cpp pools each ubatch
and keeps the last); the rows are n_tokens x n_embd floats, which costs nothing next to
the forward pass.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any, Mapping, Sequence

import numpy as np

from llama.batch import UBatch


class PoolingType(IntEnum):
    """llama.cpp's enum llama_pooling_type (UNSPECIFIED -1: take the file's)."""

    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4


POOLING_NAMES = {p.name.lower(): p for p in PoolingType}
UNSPECIFIED = -1


def pooling_from_file(metadata: Mapping[str, Any], arch: str) -> PoolingType:
    """`{arch}.pooling_type`, none when the file has no such key (llama.cpp's default)."""
    value = metadata.get(f"{arch}.pooling_type", 0)
    try:
        return PoolingType(int(value))
    except (TypeError, ValueError):
        raise ValueError(f"{arch}.pooling_type in the model file is {value!r}, "
                         f"not one of {[int(p) for p in PoolingType]}") from None


def resolve_pooling(value: str | int | None, metadata: Mapping[str, Any], arch: str) -> PoolingType:
    """The pooling a context uses: the argument ("none"|"mean"|"cls"|"last"|"rank", or the
    int), else (None or -1, llama.cpp's UNSPECIFIED) the model file's."""
    if value is None:
        return pooling_from_file(metadata, arch)
    if isinstance(value, str):
        kind = POOLING_NAMES.get(value.lower())
        if kind is None:
            raise ValueError(f"unknown pooling type {value!r} (one of {', '.join(POOLING_NAMES)})")
        return kind
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) == UNSPECIFIED:
            return pooling_from_file(metadata, arch)
        try:
            return PoolingType(int(value))
        except ValueError:
            raise ValueError(f"unknown pooling type {value} (0 none, 1 mean, 2 cls, 3 last, "
                             f"4 rank, -1 from the file)") from None
    raise ValueError(f"pooling_type must be a name, an int or None, got {value!r}")


def check_supported(kind: PoolingType, tensor_names: Sequence[str] = ()) -> None:
    """Rank pooling is llama.cpp's: the sequence's last token (its first for a non-causal
    model), then the file's classification head, the score being the first value. No
    architecture here applies a head (`cls.*` tensors): a file that has one is refused at
    context creation, not scored wrong; without one the score is the pooled state's first
    value, as llama.cpp gives it."""
    if kind == PoolingType.RANK:
        head = sorted(n for n in tensor_names if n.startswith("cls"))
        if head:
            raise ValueError(f"pooling type 'rank': this file's classification head ({', '.join(head)}) "
                             "is not implemented")


def batch_layout(ubatches: Sequence[UBatch], n_tokens: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Positions and sequence ids of every batch token, in batch order, from its ubatches."""
    pos = np.empty(n_tokens, np.int64)
    seq_ids: list[tuple[int, ...]] = [()] * n_tokens
    for ub in ubatches:
        pos[ub.idxs] = ub.pos
        for i, ids in zip(ub.idxs.tolist(), ub.seq_ids):
            seq_ids[i] = tuple(ids)
    return pos, seq_ids


def pool(rows: np.ndarray, pos: np.ndarray, seq_ids: Sequence[Sequence[int]],
         kind: PoolingType, causal: bool = True) -> dict[int, np.ndarray]:
    """One vector per sequence from the token rows [n_tokens, n_embd] (batch order).

    mean: the average of the sequence's tokens; cls: its token at the lowest position
    (position 0 for a new sequence, as llama.cpp's inp_cls); last: its token at the highest
    position (llama.cpp's LAST); rank: last for a causal model, else cls (the score is the
    vector's first value, `check_supported`). A token in several sequences counts in each."""
    if kind == PoolingType.RANK:
        kind = PoolingType.LAST if causal else PoolingType.CLS
    members: dict[int, list[int]] = {}
    for i, ids in enumerate(seq_ids):
        for s in ids:
            members.setdefault(int(s), []).append(i)
    out: dict[int, np.ndarray] = {}
    for s, idx_list in members.items():
        idx = np.asarray(idx_list)
        if kind == PoolingType.MEAN:
            out[s] = rows[idx].mean(axis=0, dtype=np.float64).astype(np.float32)
        elif kind == PoolingType.CLS:
            out[s] = rows[idx[np.argmin(pos[idx])]].copy()
        elif kind == PoolingType.LAST:
            out[s] = rows[idx[np.argmax(pos[idx])]].copy()
        else:
            raise ValueError(f"pooling {kind.name.lower()} gives no vector per sequence")
    return out
