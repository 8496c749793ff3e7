"""The bookkeeping half of the KV cache: which cell holds which position of which sequences.

This follows llama.cpp's `llama_kv_cells` (src/llama-kv-cells.h) and the metadata side of
`llama_kv_cache` (src/llama-kv-cache.cpp) for one unified stream (all sequences share the
cells, as llama.cpp with `kv_unified`). The tensor storage lives elsewhere; it asks this
module where each ubatch token goes (`k_idxs`), how many cells a graph must read (`get_n_kv`)
and which of them each token may attend (`kq_mask`).

A cell is empty (pos -1) or holds one position shared by a set of sequences (a row of the
`seq` bool matrix). Every sequence keeps a multiset of its positions so `seq_pos_min/max`
are O(1). `shift` accumulates the deltas of `seq_add`/`seq_div` since the last
`reset_shift()`, for the K-shift (re-RoPE) the graph side applies when `has_shift` is set.

Placement: llama.cpp's (the first usable cells from the head), or, with `seq_block` (the
context sets it when several sequences share the cache), in blocks of that many cells, each
holding tokens of one sequence. Under llama.cpp's placement a batched decode step puts each
sequence's new token next to the others', so every 16-key chunk holds keys of every sequence
and attention computes them all, masked: four 1,000-token sequences cost each token 4,000
keys. With blocks, a token's query sees only its own sequence's blocks (and shared ones),
and the CPU attention kernels skip the rest (codegen_cpu/kernels/extent.py). The results are
the same but for the order of the softmax's lane sums.

Decode flow: `prepare(ubatches)` finds a slot for every ubatch on the live state and then
restores it (all or nothing, nothing changes); then, for each ubatch, `apply_ubatch(slot,
ubatch)` writes the cells, `get_n_kv()` and `kq_mask` give the graph inputs.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from llama.batch import LLAMA_MAX_SEQ, POS_MAX, UBatch
from llama.kv_mask import SWAType, check_swa, is_masked_swa, kq_mask

__all__ = ["KVCells", "KVCellsState", "KVCellsUndo", "SEQ_BLOCK", "SWAType", "SlotInfo", "is_masked_swa"]

# cells per sequence block: whole chunks of the CPU attention kernels (16 keys for the scores
# and weights x V, 64 lanes for the softmax), so a block of another sequence is skipped whole
SEQ_BLOCK = 64


class _PosMultiset:
    """Positions of one sequence with counts, keys kept sorted: min/max O(1), add O(log n)
    search (a cell may repeat a position, e.g. for embedding inputs)."""

    __slots__ = ("count", "keys")

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.keys: list[int] = []

    def add(self, p: int) -> None:
        c = self.count.get(p, 0)
        if c == 0:
            bisect.insort(self.keys, p)
        self.count[p] = c + 1

    def remove(self, p: int) -> None:
        c = self.count[p]
        if c == 1:
            del self.count[p]
            del self.keys[bisect.bisect_left(self.keys, p)]
        else:
            self.count[p] = c - 1

    def copy(self) -> "_PosMultiset":
        other = _PosMultiset()
        other.count = dict(self.count)
        other.keys = list(self.keys)
        return other


@dataclass(frozen=True)
class SlotInfo:
    """The cell index of every token of one ubatch, in ubatch order (llama.cpp's slot_info
    for a single stream)."""

    idxs: np.ndarray      # int64 [n_tokens]

    @property
    def n_tokens(self) -> int:
        return len(self.idxs)


class KVCellsUndo(NamedTuple):
    """What `restore` needs to undo `apply_ubatch` on cells that were all empty (always,
    outside SWA caches): the cells, and the head before. See `checkpoint`."""

    idxs: list[int]
    head: int


@dataclass(frozen=True)
class KVCellsState:
    """A copy of the cell metadata, from `snapshot()`, for `restore()`."""

    pos: np.ndarray
    seq: np.ndarray
    shift: np.ndarray
    seq_pos: tuple
    head: int
    has_shift: bool


class KVCells:
    """Cell metadata of a unified KV cache of `size` cells for `n_seq_max` sequences.

    n_pad: `get_n_kv` rounds the cells read up to a multiple of it, so the graph shape
    changes rarely (llama.cpp uses max(n_pad, 256)). swa_type/n_swa: the window of the layers
    this cache serves; cells outside every token's window may be overwritten by `find_slot`
    and are masked by `kq_mask`. seq_block: 0 for llama.cpp's placement, else the cells per
    sequence block (see the module docstring).
    """

    def __init__(self, size: int, n_seq_max: int = 1, *, n_pad: int = 256,
                 swa_type: SWAType | int = SWAType.NONE, n_swa: int = 0, seq_block: int = 0) -> None:
        if size < 1:
            raise ValueError(f"KV cache size must be at least 1, got {size}")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQ:
            raise ValueError(f"n_seq_max = {n_seq_max} is not in [1, {LLAMA_MAX_SEQ}]")
        if n_pad < 1:
            raise ValueError(f"n_pad must be at least 1, got {n_pad}")
        if seq_block < 0:
            raise ValueError(f"seq_block must be 0 (llama.cpp's placement) or a block size, got {seq_block}")
        self.seq_block = int(seq_block)
        self.size = int(size)
        self.n_seq_max = int(n_seq_max)
        self.n_pad = int(n_pad)
        self.swa_type = check_swa(swa_type, n_swa)
        self.n_swa = int(n_swa)
        self.pos = np.full(self.size, -1, dtype=np.int32)
        self.seq = np.zeros((self.size, self.n_seq_max), dtype=bool)
        self.shift = np.zeros(self.size, dtype=np.int32)
        self.has_shift = False
        self.head = 0
        self._seq_pos = [_PosMultiset() for _ in range(self.n_seq_max)]
        self._used: list[int] = []  # sorted indices of the non-empty cells (llama.cpp's `used`)
        self._last: dict[int, int] = {}  # the cell each sequence was last placed in (a hint: checked)

    # -- queries ---------------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Number of non-empty cells."""
        return len(self._used)

    def used_max_p1(self) -> int:
        """Index of the last non-empty cell + 1 (0 when all are empty)."""
        return self._used[-1] + 1 if self._used else 0

    def is_empty(self, i: int) -> bool:
        return bool(self.pos[i] < 0)

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of `seq_id` in the cells, -1 when it has none."""
        keys = self._seq_pos[self._check_seq(seq_id)].keys
        return keys[0] if keys else -1

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of `seq_id` in the cells, -1 when it has none."""
        keys = self._seq_pos[self._check_seq(seq_id)].keys
        return keys[-1] if keys else -1

    def get_n_kv(self, n_pad: int | None = None) -> int:
        """Cells the graph reads: the last used cell + 1 padded up to n_pad (at least n_pad),
        capped by the size. Call it after `apply_ubatch` so the ubatch's own cells count."""
        pad = self.n_pad if n_pad is None else int(n_pad)
        used = self.used_max_p1()
        padded = -(-used // pad) * pad
        return min(self.size, max(pad, padded))

    def k_shift(self) -> np.ndarray:
        """int32 [size]: the pending shift of every cell (0 for empty ones), the K-shift input."""
        return np.where(self.pos >= 0, self.shift, 0).astype(np.int32)

    def reset_shift(self) -> None:
        """Call after the K-shift has been applied to the K tensors."""
        self.shift[:] = 0
        self.has_shift = False

    # -- slots -----------------------------------------------------------------------------

    def find_slot(self, ubatch: UBatch, cont: bool = False) -> SlotInfo | None:
        """Cells for every token of `ubatch`, searching from the head and wrapping around;
        None when there is no room. Usable cells are empty ones, and cells of a single
        sequence whose position is outside that sequence's window (SWA caches only). With
        `cont` the cells must be consecutive. Nothing is modified."""
        n_tokens = ubatch.n_tokens
        if n_tokens > self.size or n_tokens == 0:
            return None
        if self.seq_block and not cont:
            return self._find_in_blocks(ubatch)
        head = self.head
        # plenty of free cells before the head: better to fill the cache from the start
        if head > len(self._used) + 2 * n_tokens:
            head = 0
        if n_tokens == 1 and not cont and head < self.size and self.pos.item(head) < 0:
            return SlotInfo(np.array([head], dtype=np.int64))  # decode: the head cell is free
        usable = self._usable_cells()
        if cont:
            return self._find_contiguous(usable, head, n_tokens)
        if n_tokens == 1:  # decode: the first usable cell from the head on, else from 0
            cell = _first_usable(usable, head)
            return None if cell is None else SlotInfo(np.array([cell], dtype=np.int64))
        idx = np.flatnonzero(usable)
        ordered = np.concatenate([idx[idx >= head], idx[idx < head]])
        if len(ordered) < n_tokens:
            return None
        return SlotInfo(ordered[:n_tokens].astype(np.int64))

    def _find_in_blocks(self, ubatch: UBatch) -> SlotInfo | None:
        """find_slot with sequence blocks: each token goes to the cell after its sequence's
        last one while that stays in the block (or the next block is wholly free), else to
        the first wholly free block, else (no free block left) to the first usable cell from
        the head, as llama.cpp places it."""
        free = self._usable_cells()
        following: dict[int, int | None] = {}
        idxs = []
        for seqs in ubatch.seq_ids:
            s = seqs[0]
            if s not in following:
                following[s] = self._after_last(s)
            cell = self._cell_in_blocks(free, following[s])
            if cell is None:
                return None
            free[cell] = False
            idxs.append(cell)
            following[s] = cell + 1
        return SlotInfo(np.array(idxs, dtype=np.int64))

    def _after_last(self, s: int) -> int | None:
        """The cell after the one sequence s was last placed in (else after its highest
        cell); None when it holds no cell."""
        last = self._last.get(s)
        if last is None or not self.seq.item(last, s):
            cells = np.flatnonzero(self.seq[:, s])
            if not len(cells):
                return None
            last = int(cells[-1])
        return last + 1

    def _cell_in_blocks(self, free: np.ndarray, following: int | None) -> int | None:
        block = self.seq_block
        c = following
        if c is not None and c < self.size and free.item(c) and (c % block or free[c:c + block].all()):
            return c
        n_blocks = self.size // block
        if n_blocks:
            whole = free[:n_blocks * block].reshape(n_blocks, block).all(axis=1)
            first = int(whole.argmax())
            if whole.item(first):
                return first * block
        return _first_usable(free, self.head)

    def _usable_cells(self) -> np.ndarray:
        usable = self.pos < 0
        if self.swa_type == SWAType.NONE:
            return usable
        single = (self.pos >= 0) & (self.seq.sum(axis=1) == 1)
        seq_of = self.seq.argmax(axis=1)
        pos_max = np.array([self.seq_pos_max(s) for s in range(self.n_seq_max)], np.int64)
        masked = is_masked_swa(self.n_swa, self.swa_type, self.pos.astype(np.int64),
                               pos_max[seq_of] + 1)
        return usable | (single & masked)

    def _find_contiguous(self, usable: np.ndarray, head: int, n: int) -> SlotInfo | None:
        # llama.cpp tests windows [head, head+n) and moves on past a blocking cell; we test
        # every start once, in the order its scan reaches them
        for start in list(range(head, self.size)) + list(range(0, head)):
            if start + n <= self.size and usable[start:start + n].all():
                return SlotInfo(np.arange(start, start + n, dtype=np.int64))
        return None

    def prepare(self, ubatches: list[UBatch]) -> list[SlotInfo] | None:
        """Slots for all ubatches, each found after placing the previous ones; the state is
        restored afterwards whatever happens, so the result is all or nothing (None)."""
        if len(ubatches) == 1:  # nothing to place before it: find_slot alone changes nothing
            slot = self.find_slot(ubatches[0])
            return None if slot is None else [slot]
        state = self.snapshot()
        slots = []
        try:
            for ub in ubatches:
                slot = self.find_slot(ub)
                if slot is None:
                    return None
                slots.append(slot)
                self.apply_ubatch(slot, ub)
        finally:
            self.restore(state)
        return slots

    def apply_ubatch(self, slot: SlotInfo, ubatch: UBatch) -> None:
        """Write the positions and sequences of `ubatch` into its cells and move the head."""
        if slot.n_tokens != ubatch.n_tokens:
            raise ValueError(f"slot has {slot.n_tokens} cells for a ubatch of "
                             f"{ubatch.n_tokens} tokens")
        for seqs in ubatch.seq_ids:
            for s in seqs:
                self._check_seq(s)
        pos_max_rm: dict[int, int] = {}
        positions = np.asarray(ubatch.pos).tolist()  # Python ints
        idxs = slot.idxs.tolist()
        for i, idx in enumerate(idxs):
            old = self.pos.item(idx)
            if old >= 0:
                # an SWA cell we may overwrite: remember what the sequence loses
                for s in np.flatnonzero(self.seq[idx]).tolist():
                    pos_max_rm[s] = max(pos_max_rm.get(s, -1), old)
                self._rm(idx)
            p = positions[i]
            self.pos[idx] = p
            bisect.insort(self._used, idx)
            for s in ubatch.seq_ids[i]:
                self.seq[idx, s] = True
                self._seq_pos[s].add(p)
                self._last[s] = idx
        # keep every position between pos_min and pos_max of a sequence present
        for s, pmax in pos_max_rm.items():
            if self.seq_pos_min(s) <= pmax:
                self.seq_rm(s, self.seq_pos_min(s), pmax + 1)
        self.head = idxs[-1] + 1

    # -- sequence operations ---------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove `seq_id` (-1: every sequence) from the cells with pos in [p0, p1); p0 < 0
        means 0 and p1 < 0 means infinity. Cells left with no sequence become empty."""
        p0, p1 = _range(p0, p1)
        in_range = (self.pos >= p0) & (self.pos < p1)
        if seq_id == -1:
            freed = np.flatnonzero(in_range)
            for i in freed.tolist():
                self._rm(i)
        else:
            s = self._check_seq(seq_id)
            hit = np.flatnonzero(in_range & self.seq[:, s])
            for i in hit.tolist():
                self._seq_pos[s].remove(int(self.pos[i]))
            self.seq[hit, s] = False
            freed = hit[~self.seq[hit].any(axis=1)]
            self.pos[freed] = -1
            self.shift[freed] = 0
            for i in freed.tolist():
                self._unuse(i)
        if len(freed) and int(freed[0]) < self.head:
            self.head = int(freed[0])
        return True

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make `seq_dst` share the cells of `seq_src` with pos in [p0, p1) (no data copy)."""
        src, dst = self._check_seq(seq_src), self._check_seq(seq_dst)
        if src == dst:
            return
        p0, p1 = _range(p0, p1)
        hit = np.flatnonzero((self.pos >= p0) & (self.pos < p1) & self.seq[:, src]
                             & ~self.seq[:, dst])
        self.seq[hit, dst] = True
        for i in hit.tolist():
            self._seq_pos[dst].add(int(self.pos[i]))

    def seq_keep(self, seq_id: int) -> None:
        """Remove every other sequence: cells of `seq_id` keep only it, the rest are freed."""
        s = self._check_seq(seq_id)
        keep = np.flatnonzero(self.seq[:, s])
        others = [t for t in range(self.n_seq_max) if t != s]
        for i in keep.tolist():
            for t in others:
                if self.seq[i, t]:
                    self._seq_pos[t].remove(int(self.pos[i]))
        self.seq[np.ix_(keep, others)] = False
        freed = np.flatnonzero((self.pos >= 0) & ~self.seq[:, s])
        for i in freed.tolist():
            self._rm(i)
        if len(freed) and int(freed[0]) < self.head:
            self.head = int(freed[0])

    def seq_shared(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Whether a cell of `seq_id` with pos in [p0, p1) also belongs to another sequence
        (seq_add would move it for that one too)."""
        s = self._check_seq(seq_id)
        p0, p1 = _range(p0, p1)
        hit = (self.pos >= p0) & (self.pos < p1) & self.seq[:, s]
        return bool((self.seq[hit].sum(axis=1) > 1).any())

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift the positions of the cells of `seq_id` in [p0, p1) by `delta` (the whole cell
        moves, with every sequence sharing it); cells pushed below 0 are removed."""
        s = self._check_seq(seq_id)
        if delta == 0:
            return
        p0, p1 = _range(p0, p1)
        if p0 == p1:
            return
        hit = np.flatnonzero((self.pos >= p0) & (self.pos < p1) & self.seq[:, s])
        new_head = None
        for i in hit.tolist():
            self.has_shift = True
            new_pos = int(self.pos[i]) + delta
            if new_pos < 0:
                self._rm(i)
                new_head = i if new_head is None else new_head
            else:
                self._seq_pos_update(i, new_pos)
                self.shift[i] += delta
        self.head = new_head if new_head is not None else 0

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide the positions of the cells of `seq_id` in [p0, p1) by `d`."""
        s = self._check_seq(seq_id)
        if d < 1:
            raise ValueError(f"seq_div divisor must be at least 1, got {d}")
        if d == 1:
            return
        p0, p1 = _range(p0, p1)
        if p0 == p1:
            return
        hit = np.flatnonzero((self.pos >= p0) & (self.pos < p1) & self.seq[:, s])
        for i in hit.tolist():
            old = int(self.pos[i])
            self._seq_pos_update(i, old // d)
            self.shift[i] += old - old // d
            self.has_shift = True

    def clear(self) -> None:
        """Empty every cell (llama_memory_clear)."""
        self.pos[:] = -1
        self.seq[:] = False
        self.shift[:] = 0
        self.has_shift = False
        self.head = 0
        self._seq_pos = [_PosMultiset() for _ in range(self.n_seq_max)]
        self._used = []
        self._last = {}

    # -- state -----------------------------------------------------------------------------

    def snapshot(self) -> KVCellsState:
        return KVCellsState(self.pos.copy(), self.seq.copy(), self.shift.copy(),
                            tuple(m.copy() for m in self._seq_pos), self.head, self.has_shift)

    def checkpoint(self, slot: SlotInfo) -> KVCellsUndo | KVCellsState:
        """Taken before `apply_ubatch(slot, ...)`, for `restore` to undo it (a failed
        ubatch). When the slot's cells are all empty, undoing means emptying them again, so
        this only notes them and the head; otherwise it is a full `snapshot()`."""
        idxs = slot.idxs.tolist()
        pos = self.pos
        if all(pos.item(i) < 0 for i in idxs):
            return KVCellsUndo(idxs, self.head)
        return self.snapshot()

    def restore(self, state: KVCellsState | KVCellsUndo) -> None:
        if isinstance(state, KVCellsUndo):
            for i in state.idxs:
                if self.pos.item(i) >= 0:
                    self._rm(i)
            self.head = state.head
            return
        if state.pos.shape != self.pos.shape or state.seq.shape != self.seq.shape:
            raise ValueError("snapshot was taken from a KV cache of another size")
        self.pos = state.pos.copy()
        self.seq = state.seq.copy()
        self.shift = state.shift.copy()
        self._seq_pos = [m.copy() for m in state.seq_pos]
        self.head = state.head
        self.has_shift = state.has_shift
        self._used = np.flatnonzero(self.pos >= 0).tolist()

    # -- graph inputs ----------------------------------------------------------------------

    def kq_mask(self, ubatch: UBatch, n_kv: int, *, causal: bool = True,
                swa_type: SWAType | int | None = None, n_swa: int | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """float32 [n_tokens, n_kv]: 0 where token i may attend cell j, -inf otherwise.

        A token sees non-empty cells of its first sequence (llama.cpp assumes the sequences
        of a shared token are equivalent), not in its future when `causal`, inside the window
        of `swa_type`/`n_swa` (None: this cache's own window; pass SWAType.NONE for none).
        `out`: a float32 array of that shape to fill (the context reuses one per graph
        input, so the compiled graph keeps its address); a new one otherwise.
        """
        return kq_mask(self, ubatch, n_kv, causal=causal, swa_type=swa_type, n_swa=n_swa, out=out)

    @staticmethod
    def k_idxs(slot: SlotInfo) -> np.ndarray:
        """int64 [n_tokens]: the cell (K row) each ubatch token writes to."""
        return np.asarray(slot.idxs, dtype=np.int64).copy()

    def v_idxs(self, slot: SlotInfo, n_embd_v_gqa: int | None = None) -> np.ndarray:
        """int64 V destinations: as `k_idxs` for a V cache stored by rows; for a transposed V
        cache ([n_embd_v_gqa][size], no flash attention) give n_embd_v_gqa to get one index
        per element, j * size + cell for j in range(n_embd_v_gqa), token-major."""
        idxs = self.k_idxs(slot)
        if n_embd_v_gqa is None:
            return idxs
        j = np.arange(n_embd_v_gqa, dtype=np.int64)
        return (idxs[:, None] + j[None, :] * self.size).reshape(-1)

    # -- internals -------------------------------------------------------------------------

    def _check_seq(self, seq_id: int) -> int:
        if not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"sequence id {seq_id} is out of range [0, {self.n_seq_max})")
        return int(seq_id)

    def _rm(self, i: int) -> None:
        """Empty a non-empty cell."""
        p = int(self.pos[i])
        for s in np.flatnonzero(self.seq[i]).tolist():
            self._seq_pos[s].remove(p)
        self.seq[i] = False
        self.pos[i] = -1
        self.shift[i] = 0
        self._unuse(i)

    def _unuse(self, i: int) -> None:
        """Cell i has just become empty."""
        del self._used[bisect.bisect_left(self._used, i)]

    def _seq_pos_update(self, i: int, new_pos: int) -> None:
        """Move non-empty cell i to new_pos >= 0, in the multisets of its sequences too."""
        old = int(self.pos[i])
        for s in np.flatnonzero(self.seq[i]).tolist():
            self._seq_pos[s].remove(old)
            self._seq_pos[s].add(new_pos)
        self.pos[i] = new_pos


def _first_usable(usable: np.ndarray, head: int) -> int | None:
    """The first usable cell from the head on, else from 0 (llama.cpp's scan for one token)."""
    for part, start in ((usable[head:], head), (usable[:head], 0)):
        if len(part):
            i = int(part.argmax())
            if part.item(i):
                return start + i
    return None


def _range(p0: int, p1: int) -> tuple[int, int]:
    """llama.cpp's range convention: p0 < 0 -> 0, p1 < 0 -> infinity (clamped to int32)."""
    p0 = 0 if p0 < 0 else min(int(p0), POS_MAX)
    p1 = POS_MAX if p1 < 0 else min(int(p1), POS_MAX)
    return p0, p1
