"""Attention masks over KV cells (llama.cpp's set_input_kq_mask) and the sliding-window
rules they apply (llama_swa_type, llama_hparams::is_masked_swa).

`kq_mask` reads a cell table (`KVCells`: pos, seq, size, n_seq_max, its own window and
seq_pos_max) and never changes it. A one-token ubatch (every decode step) gets one row built
with a few array operations; larger ubatches the general [n_tokens, n_kv] formula.
"""
from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llama.batch import UBatch
    from llama.kv_cells import KVCells

_F32 = np.dtype(np.float32)


class SWAType(IntEnum):
    """llama_swa_type: how a sliding-window attention layer limits what a token sees."""

    NONE = 0
    STANDARD = 1     # see the last n_swa positions: masked when p1 - p0 >= n_swa
    CHUNKED = 2      # see only its own chunk of n_swa positions
    SYMMETRIC = 3    # see |p1 - p0| <= n_swa // 2 (non-causal models)


def is_masked_swa(n_swa: int, swa_type: SWAType | int, p0, p1):
    """Whether a token at p1 may NOT see the cell at p0 because of the window (llama.cpp's
    llama_hparams::is_masked_swa). Works on ints and on broadcast numpy arrays."""
    swa_type = SWAType(swa_type)
    p0 = np.asarray(p0)
    p1 = np.asarray(p1)
    if swa_type == SWAType.NONE:
        out = np.zeros(np.broadcast_shapes(p0.shape, p1.shape), dtype=bool)
    elif swa_type == SWAType.STANDARD:
        out = p1 - p0 >= n_swa
    elif swa_type == SWAType.CHUNKED:
        out = p0 < (p1 // n_swa) * n_swa
    else:
        diff = p1 - p0
        half = n_swa // 2
        out = (diff < -half) | (diff > half)
    return bool(out) if out.ndim == 0 else out


def check_swa(swa_type: SWAType | int, n_swa: int) -> SWAType:
    """swa_type as a SWAType, with the window it needs; a clear error otherwise."""
    if type(swa_type) is not SWAType:
        try:
            swa_type = SWAType(swa_type)
        except ValueError:
            raise ValueError(f"unknown swa_type {swa_type!r} (0..3: none, standard, chunked, "
                             f"symmetric)") from None
    if swa_type != SWAType.NONE and n_swa <= 0:
        raise ValueError(f"swa_type {swa_type.name} needs n_swa > 0, got {n_swa}")
    return swa_type


def kq_mask(cells: "KVCells", ubatch: "UBatch", n_kv: int, *, causal: bool = True,
            swa_type: SWAType | int | None = None, n_swa: int | None = None,
            out: np.ndarray | None = None) -> np.ndarray:
    """float32 [n_tokens, n_kv]: 0 where token i may attend cell j, -inf otherwise (see
    KVCells.kq_mask, which calls this)."""
    if not 0 <= n_kv <= cells.size:
        raise ValueError(f"n_kv = {n_kv} is not in [0, {cells.size}]")
    swa = cells.swa_type if swa_type is None else swa_type
    window = cells.n_swa if n_swa is None else n_swa
    swa = check_swa(swa, window)
    first = [seqs[0] for seqs in ubatch.seq_ids]
    if first and (min(first) < 0 or max(first) >= cells.n_seq_max):
        raise ValueError(f"ubatch sequence ids must be in [0, {cells.n_seq_max})")
    shape = (len(first), n_kv)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != _F32:
        raise ValueError(f"kq_mask out must be float32 {shape}, got {out.dtype} {out.shape}")
    if len(first) == 1:
        # decode: one row. A cell holding a sequence is never empty, so the row is the
        # sequence's cells (not after the token when causal, inside its window)
        s = first[0]
        allowed = cells.seq[None, :n_kv, s]
        p = int(ubatch.pos[0])
        if causal and p < cells.seq_pos_max(s):  # else no cell of s is after the token
            allowed = allowed & (cells.pos[None, :n_kv] <= p)
        if swa != SWAType.NONE:
            allowed = allowed & ~is_masked_swa(window, swa, cells.pos[None, :n_kv].astype(np.int64), p)
        out.fill(-np.inf)
        np.copyto(out, 0.0, where=allowed)
        return out
    p0 = cells.pos[:n_kv][None, :]
    p1 = np.asarray(ubatch.pos)[:, None]
    if first and min(first) == max(first):  # one sequence: one row of seq flags to broadcast
        allowed = (p0 >= 0) & cells.seq[:n_kv, first[0]][None, :]
    else:
        allowed = (p0 >= 0) & cells.seq[:n_kv][:, np.array(first, dtype=np.int64)].T
    if causal:
        allowed = allowed & (p0 <= p1)
    if swa != SWAType.NONE:
        allowed = allowed & ~is_masked_swa(window, swa, p0.astype(np.int64), p1.astype(np.int64))
    out.fill(-np.inf)
    np.copyto(out, 0.0, where=allowed)
    return out
