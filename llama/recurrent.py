"""Recurrent state per sequence (llama.cpp's llama_memory_recurrent), for the layers of
Mamba-like and gated delta-net models that carry a state instead of a KV cache.

Every recurrent layer keeps two buffers, `cache_r_l{il}` (the short convolution's last
d_conv - 1 inputs, n_embd_r floats per row) and `cache_s_l{il}` (the recurrence's state,
n_embd_s floats per row). A sequence owns two rows of each: the one its state is in and a
spare. A ubatch's graph reads the current rows (`src`) and writes the new state into the
spare ones (`dst`); only when the ubatch has computed does the sequence switch rows. A
failed ubatch therefore leaves every state as it was without copying any (decode's
all-or-nothing rule), which llama.cpp, writing in place, cannot undo.

A sequence's state covers all of its tokens at once, so its positions cannot be removed
partially: the sequence operations follow llama.cpp's (its default, without the
experimental per-token rollback `n_rs_seq`):
- seq_rm removes a sequence whose last position lies in [p0, p1); a range that starts
  after 0 and contains that position is refused (False); a negative seq_id removes every
  sequence, and then only the whole range (or an empty one) is accepted;
- seq_cp gives the destination a copy of the source's state and position (any range);
- seq_keep, seq_add and seq_div act on the last position only;
- seq_pos_min and seq_pos_max are both that position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from llama.batch import UBatch
from llama.hparams import HParams

POS_MAX = 2**31 - 1


@dataclass(frozen=True)
class RSSlot:
    """Where one ubatch's sequences read their state and write the next (row indices into
    every layer's buffers), and the sets of sequence ids that share each state."""

    seqs: tuple[tuple[int, ...], ...]   # per ubatch sequence (in order): its sequence ids
    src: np.ndarray                     # int32 [n_seqs]: the rows read
    dst: np.ndarray                     # int64 [n_seqs]: the rows written
    last_pos: tuple[int, ...]           # per ubatch sequence: its last position in the ubatch


@dataclass(frozen=True)
class RSSeqState:
    """One sequence's states (every layer's row) and last position: a context checkpoint."""

    pos: int
    rows: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.rows.values())


@dataclass(frozen=True)
class RSState:
    """What restore() needs: every sequence's row and position."""

    row: tuple[int, ...]
    pos: tuple[int, ...]


class RecurrentMemory:
    def __init__(self, hp: HParams, n_seq_max: int = 1, layers: Iterable[int] | None = None):
        self.hp = hp
        self.n_seq_max = max(1, n_seq_max)
        self.layers = sorted(set(layers)) if layers is not None else list(range(hp.n_layer))
        n_rows = 2 * self.n_seq_max
        self.r = {il: np.zeros((n_rows, hp.n_embd_r), np.float32) for il in self.layers}
        self.s = {il: np.zeros((n_rows, hp.n_embd_s), np.float32) for il in self.layers}
        self._bindings = {f"cache_r_l{il}": a for il, a in self.r.items()}
        self._bindings.update({f"cache_s_l{il}": a for il, a in self.s.items()})
        self.row = list(range(self.n_seq_max))   # each sequence's current row
        self.pos = [-1] * self.n_seq_max          # each sequence's last position (-1: empty)

    @property
    def size(self) -> int:
        return 2 * self.n_seq_max

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._bindings.values())

    def bindings(self) -> dict[str, np.ndarray]:
        return self._bindings

    # decode -----------------------------------------------------------------------------------
    def prepare(self, ubatches: list[UBatch]) -> list[RSSlot] | None:
        """A slot for every ubatch, or None when a sequence id is out of range; nothing
        changes either way. The rows of ubatch i are those ubatch i - 1 leaves current."""
        row, pos = list(self.row), list(self.pos)
        slots = []
        for ub in ubatches:
            seqs, last = _sequences(ub)
            if any(not 0 <= s < self.n_seq_max for ids in seqs for s in ids):
                return None
            src = np.array([row[ids[0]] for ids in seqs], np.int32)
            dst = np.array([self._spare(row[ids[0]]) for ids in seqs], np.int64)
            slots.append(RSSlot(tuple(seqs), src, dst, tuple(last)))
            for ids, d, p in zip(seqs, dst, last):   # as commit_ubatch will leave them
                row[ids[0]], pos[ids[0]] = int(d), p
                for s in ids[1:]:
                    row[s], pos[s] = self._home(s)[0], p
        return slots

    def begin_ubatch(self, slot: RSSlot) -> None:
        """Before the graph runs: a sequence without a state starts from zeros."""
        for ids, src in zip(slot.seqs, slot.src):
            if self.pos[ids[0]] < 0:
                for a in self._bindings.values():
                    a[src] = 0.0

    def commit_ubatch(self, slot: RSSlot) -> None:
        """After the graph ran: the sequences move to the rows it wrote. The other ids of a
        sequence set get their own copy of the state (in their own row pair)."""
        for ids, dst, p in zip(slot.seqs, slot.dst, slot.last_pos):
            first = ids[0]
            self.row[first], self.pos[first] = int(dst), p
            for s in ids[1:]:
                self._copy_state(first, s)

    def checkpoint(self, slot: RSSlot) -> RSState:
        return self.snapshot()

    def snapshot(self) -> RSState:
        return RSState(tuple(self.row), tuple(self.pos))

    def restore(self, state: RSState) -> None:
        self.row, self.pos = list(state.row), list(state.pos)

    def seq_state(self, seq_id: int) -> RSSeqState:
        """A copy of the sequence's states and position."""
        row = self.row[seq_id]
        return RSSeqState(self.pos[seq_id], {name: a[row].copy() for name, a in self._bindings.items()})

    def set_seq_state(self, seq_id: int, state: RSSeqState) -> None:
        """The sequence's states and position become `state`'s (llama.cpp's state_seq_set)."""
        row = self.row[seq_id]
        for name, a in self._bindings.items():
            a[row] = state.rows[name]
        self.pos[seq_id] = state.pos

    def _spare(self, row: int) -> int:
        return row + self.n_seq_max if row < self.n_seq_max else row - self.n_seq_max

    def _home(self, seq: int) -> tuple[int, int]:
        return seq, seq + self.n_seq_max

    def _copy_state(self, src_seq: int, dst_seq: int) -> None:
        """dst_seq's state and position become src_seq's (in one of dst_seq's own rows)."""
        src_row = self.row[src_seq]
        dst_row = self._home(dst_seq)[0]
        for a in self._bindings.values():
            a[dst_row] = a[src_row]
        self.row[dst_seq], self.pos[dst_seq] = dst_row, self.pos[src_seq]

    # the memory interface (llama_memory_*) ----------------------------------------------------
    def clear(self, data: bool = True) -> None:
        self.pos = [-1] * self.n_seq_max
        self.row = list(range(self.n_seq_max))
        if data:
            for a in self._bindings.values():
                a.fill(0)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        p0 = max(p0, 0)
        p1 = POS_MAX if p1 < 0 else p1
        if seq_id >= self.n_seq_max:
            return False
        if seq_id >= 0:
            pos = self.pos[seq_id]
            if pos >= 0 and 0 < p0 <= pos < p1:
                return False   # a partial removal: the state covers the earlier tokens too
            if p0 <= pos < p1:
                self.pos[seq_id] = -1
            return True
        if p0 != p1 and (p0 != 0 or p1 != POS_MAX):
            return False
        for s in range(self.n_seq_max):
            if p0 <= self.pos[s] < p1:
                self.pos[s] = -1
        return True

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int = -1, p1: int = -1) -> None:
        if seq_src == seq_dst or not (0 <= seq_src < self.n_seq_max and 0 <= seq_dst < self.n_seq_max):
            return
        self.pos[seq_dst] = -1
        if self.pos[seq_src] >= 0:
            self._copy_state(seq_src, seq_dst)

    def seq_keep(self, seq_id: int) -> None:
        for s in range(self.n_seq_max):
            if s != seq_id:
                self.pos[s] = -1

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self._move(seq_id, p0, p1, lambda p: p + delta, delta == 0)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self._move(seq_id, p0, p1, lambda p: p // d, d == 1)

    def _move(self, seq_id: int, p0: int, p1: int, fn, noop: bool) -> None:
        p0 = max(p0, 0)
        p1 = POS_MAX if p1 < 0 else p1
        if noop or p0 == p1 or not 0 <= seq_id < self.n_seq_max:
            return
        if p0 <= self.pos[seq_id] < p1:
            self.pos[seq_id] = fn(self.pos[seq_id])

    def seq_pos_min(self, seq_id: int) -> int:
        return self.pos[seq_id] if 0 <= seq_id < self.n_seq_max else -1

    def seq_pos_max(self, seq_id: int) -> int:
        return self.seq_pos_min(seq_id)

    @property
    def can_shift(self) -> bool:
        return True


def split_blocks(ubatches: list[UBatch]) -> list[UBatch]:
    """Equal splits with one sequence per ubatch, or one token per sequence: a graph of
    the recurrent layers takes a ubatch as [n_seq_tokens, 1] or [1, n_seqs]. Ubatches with
    several sequences of several tokens are cut into one per sequence (the same tokens in
    the same order; each sequence's result is the same, only fewer run at once)."""
    out = []
    for ub in ubatches:
        if not ub.equal_seqs or ub.n_seqs == 1 or ub.n_seq_tokens == 1:
            out.append(ub)
            continue
        n = ub.n_seq_tokens
        for k in range(ub.n_seqs):
            part = slice(k * n, (k + 1) * n)
            seq_ids = ub.seq_ids[part]
            out.append(UBatch(
                tokens=None if ub.tokens is None else ub.tokens[part], embd=None if ub.embd is None else ub.embd[part],
                pos=ub.pos[part], seq_ids=seq_ids, output=ub.output[part], idxs=ub.idxs[part],
                n_seq_tokens=n, n_seqs=1, equal_seqs=True, seq_id_unq=sorted(set(seq_ids[0]))))
    return out


def _sequences(ub: UBatch) -> tuple[list[tuple[int, ...]], list[int]]:
    """The ubatch's sequences in order (one per block of n_seq_tokens tokens) and the last
    position of each."""
    n = ub.n_seq_tokens if ub.equal_seqs else 1
    seqs, last = [], []
    for i in range(0, ub.n_tokens, n):
        seqs.append(tuple(ub.seq_ids[i]))
        last.append(int(ub.pos[i + n - 1]))
    return seqs, last
