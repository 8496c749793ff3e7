"""Input batches, their validation, and their split into micro-batches (ubatches).

This follows llama.cpp's `src/llama-batch.cpp`:

* `Batch` is `llama_batch`: token ids (or embedding rows), and optionally the position, the
  sequence ids and the output flag of every token. Missing fields are filled in by the
  allocator, so `Batch.from_tokens(ids)` is `llama_batch_get_one`.
* `BatchAllocator.init` is `llama_batch_allocr::init`: it validates the batch against the
  vocabulary, `n_seq_max` and the positions already stored in the memory (the KV cache), fills
  the missing fields and returns an `AllocatedBatch`. Errors raise `BatchError`, naming the
  field and the token index; the decode loop turns that into llama.cpp's return code -1.
* `AllocatedBatch.split_simple / split_equal / split_seq` cut the batch into `UBatch`es the
  way llama.cpp does; each ubatch keeps the batch index of its tokens (`idxs`) and the
  allocator collects `out_ids` (the batch index of every output, in ubatch order) so the
  decode loop can put the logits back in batch order.

Two checks of llama.cpp cannot fire as written there (the position of a sequence is never
recorded, and an intersection of sets that all contain `s` is never empty). We enforce their
evident intent instead: the positions of a sequence must not decrease in batch order, and the
sequence sets of the tokens of a sequence must narrow (a shared prompt {0,1} may be followed
by {0} or {1}, but {0} may not be followed by {0,1}). We also reject negative positions and a
sequence id repeated within one token, which would corrupt the KV cells.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

LLAMA_MAX_SEQ = 256          # llama.cpp's LLAMA_MAX_SEQ: most sequences a context may hold
POS_MAX = 2**31 - 1          # llama_pos is int32


class BatchError(ValueError):
    """An invalid batch; `field` and `index` say where (decode returns -1 for it)."""

    def __init__(self, message: str, field: str | None = None, index: int | None = None):
        super().__init__(message)
        self.field = field
        self.index = index


class SeqPosMemory(Protocol):
    """What the allocator needs from the memory: the stored position range of a sequence."""

    def seq_pos_min(self, seq_id: int) -> int: ...

    def seq_pos_max(self, seq_id: int) -> int: ...


@dataclass
class Batch:
    """A decode request, as `llama_batch`: every field but tokens/embd may be left None.

    seq_ids: one entry per token, either one sequence id or a list of them (a token shared by
    several sequences, such as a common prompt). logits: the output flag of every token.
    """

    tokens: list[int] | np.ndarray | None = None
    embd: np.ndarray | None = None
    pos: list[int] | np.ndarray | None = None
    seq_ids: list[list[int]] | list[int] | None = None
    logits: list[bool] | np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        if self.tokens is not None:
            return len(self.tokens)
        if self.embd is not None:
            return int(np.shape(self.embd)[0]) if np.ndim(self.embd) > 0 else 0
        return 0

    @classmethod
    def from_tokens(cls, ids: Sequence[int] | np.ndarray, logits_all: bool = False,
                    seq_id: int = 0, pos0: int | None = None) -> "Batch":
        """One sequence of tokens; positions continue the memory unless `pos0` is given."""
        n = len(ids)
        pos = None if pos0 is None else [pos0 + i for i in range(n)]
        logits = [True] * n if logits_all else None
        return cls(tokens=list(ids), pos=pos, seq_ids=[[seq_id] for _ in range(n)],
                   logits=logits)


@dataclass
class UBatch:
    """A micro-batch, as `llama_ubatch`: the tokens one graph evaluation processes.

    Equal splits (`equal_seqs`) hold `n_seqs` blocks of `n_seq_tokens` tokens, one block per
    sequence set, in block order; simple splits count every token as its own sequence
    (n_seq_tokens = 1), as llama.cpp does. `idxs[i]` is the batch index of token i.
    """

    tokens: np.ndarray | None          # int32 [n_tokens]
    embd: np.ndarray | None            # float32 [n_tokens, n_embd]
    pos: np.ndarray                    # int32 [n_tokens]
    seq_ids: list[tuple[int, ...]]     # the sequences of every token
    output: np.ndarray                 # bool [n_tokens]
    idxs: np.ndarray                   # int64 [n_tokens]
    n_seq_tokens: int
    n_seqs: int
    equal_seqs: bool
    seq_id_unq: list[int] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.pos)

    @property
    def n_seq_id(self) -> np.ndarray:
        return np.array([len(s) for s in self.seq_ids], dtype=np.int32)

    @property
    def n_seqs_unq(self) -> int:
        return len(self.seq_id_unq)

    @property
    def seq_idx(self) -> dict[int, int]:
        """Sequence id -> its index in `seq_id_unq`."""
        return {s: i for i, s in enumerate(self.seq_id_unq)}

    @property
    def n_outputs(self) -> int:
        return int(np.count_nonzero(self.output))

    @property
    def out_ids(self) -> np.ndarray:
        """Batch indices of the outputs of this ubatch, in ubatch order."""
        return self.idxs[self.output]

    @classmethod
    def reserve(cls, n_seq_tokens: int, n_seqs: int) -> "UBatch":
        """A worst-case ubatch of zeros for graph reservation (`ubatch_reserve`)."""
        n = n_seq_tokens * n_seqs
        return cls(tokens=np.zeros(n, np.int32), embd=None, pos=np.zeros(n, np.int32),
                   seq_ids=[(0,)] * n, output=np.zeros(n, bool), idxs=np.arange(n, dtype=np.int64),
                   n_seq_tokens=n_seq_tokens, n_seqs=n_seqs, equal_seqs=True,
                   seq_id_unq=list(range(n_seqs)))


@dataclass
class AllocatedBatch:
    """A validated batch with every field filled, plus the state of its split into ubatches."""

    tokens: np.ndarray | None          # int32 [n_tokens]
    embd: np.ndarray | None            # float32 [n_tokens, n_embd]
    pos: np.ndarray                    # int32 [n_tokens]
    seq_ids: list[tuple[int, ...]]
    output: np.ndarray                 # bool [n_tokens]
    n_seq_max: int
    seq_sets: list[int]                # bitmask of the sequences of every token
    seq_id_unq: list[int]              # sorted ids of the sequences in the batch
    coupled: set[tuple[int, int]]      # (s1, s0): a token belongs to s0 first and also to s1
    used: np.ndarray = field(init=False)
    n_used: int = field(init=False, default=0)
    out_ids: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self._seq_set_map: dict[int, list[int]] = {}
        self._seq_pos: dict[int, set[int]] = {}
        for i, (mask, seqs) in enumerate(zip(self.seq_sets, self.seq_ids)):
            self._seq_set_map.setdefault(mask, []).append(i)
            for s in seqs:
                self._seq_pos.setdefault(s, set()).add(int(self.pos[i]))
        self.split_reset()

    @property
    def n_tokens(self) -> int:
        return len(self.pos)

    @property
    def n_outputs(self) -> int:
        return int(np.count_nonzero(self.output))

    @property
    def has_cpl(self) -> bool:
        """Whether some token belongs to several sequences (coupled sequences)."""
        return bool(self.coupled)

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of `seq_id` in this batch, -1 if absent."""
        ps = self._seq_pos.get(seq_id)
        return min(ps) if ps else -1

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of `seq_id` in this batch, -1 if absent."""
        ps = self._seq_pos.get(seq_id)
        return max(ps) if ps else -1

    # -- splitting -------------------------------------------------------------------------

    def split_reset(self) -> None:
        """Forget previous splits so the batch can be split again (e.g. with another mode)."""
        self.used = np.zeros(self.n_tokens, dtype=bool)
        self.n_used = 0
        self.out_ids = []

    def split_simple(self, n_ubatch: int) -> UBatch | None:
        """The next up to n_ubatch consecutive unused tokens, in batch order; None when done."""
        _check_n_ubatch(n_ubatch)
        unused = np.flatnonzero(~self.used)
        if len(unused) == 0:
            return None
        start = int(unused[0])
        idxs = []
        for i in range(start, self.n_tokens):
            if self.used[i] or len(idxs) >= n_ubatch:
                break
            idxs.append(i)
        return self._ubatch_add(idxs, n_seqs=len(idxs), equal_seqs=False)

    def split_equal(self, n_ubatch: int, sequential: bool = False) -> UBatch | None:
        """Equal-length blocks for non-overlapping sequence sets; None when done or refused.

        Sequence sets are picked in batch order, skipping any that overlaps one already
        picked; with `sequential` the first sequence ids must be consecutive (and coupled
        sequences are refused, as llama.cpp does for its per-sequence streams). Then one token
        of every set is taken per round while every set has one left and the next round fits
        in n_ubatch. llama.cpp may pick n_ubatch + 1 sets; we stop at n_ubatch.
        """
        _check_n_ubatch(n_ubatch)
        if sequential and self.has_cpl:
            return None
        cur_sets: list[int] = []
        last_seq = -1
        for i in np.flatnonzero(~self.used):
            mask = self.seq_sets[i]
            add = all((c & mask) == 0 for c in cur_sets)
            if sequential:
                add = add and (not cur_sets or self.seq_ids[i][0] == last_seq + 1)
            if add:
                cur_sets.append(mask)
                last_seq = self.seq_ids[i][0]
                if len(cur_sets) >= n_ubatch:
                    break
        n_seqs = len(cur_sets)
        if n_seqs == 0:
            return None
        pending = [[i for i in self._seq_set_map[m] if not self.used[i]] for m in cur_sets]
        per_seq: list[list[int]] = [[] for _ in range(n_seqs)]
        while all(len(per_seq[s]) < len(pending[s]) for s in range(n_seqs)):
            for s in range(n_seqs):
                idx = pending[s][len(per_seq[s])]
                per_seq[s].append(idx)
                self.used[idx] = True
                self.n_used += 1
            if (len(per_seq[0]) + 1) * n_seqs > n_ubatch:
                break
        idxs = [i for block in per_seq for i in block]
        return self._ubatch_add(idxs, n_seqs=n_seqs, equal_seqs=True, mark_used=False)

    def split_seq(self, n_ubatch: int) -> UBatch | None:
        """One sequence set at a time: from the first unused token, the following tokens whose
        set is a subset of the current one (the set narrows as it goes); None when done."""
        _check_n_ubatch(n_ubatch)
        unused = np.flatnonzero(~self.used)
        if len(unused) == 0:
            return None
        cur = int(unused[0])
        cur_set = self.seq_sets[cur]
        idxs = []
        while True:
            idxs.append(cur)
            self.used[cur] = True
            if len(idxs) >= n_ubatch:
                break
            cur += 1
            while cur < self.n_tokens and (
                    self.used[cur] or (cur_set & self.seq_sets[cur]) != self.seq_sets[cur]):
                cur += 1
            if cur == self.n_tokens:
                break
            cur_set = self.seq_sets[cur]
        self.n_used += len(idxs)
        return self._ubatch_add(idxs, n_seqs=1, equal_seqs=True, mark_used=False)

    def split_all(self, n_ubatch: int, mode: str = "simple",
                  sequential: bool = False) -> list[UBatch] | None:
        """Split the whole batch (after a reset); None if some tokens could not be placed,
        which llama.cpp reports as a failed prepare (decode returns 1)."""
        split = {"simple": lambda: self.split_simple(n_ubatch),
                 "equal": lambda: self.split_equal(n_ubatch, sequential),
                 "seq": lambda: self.split_seq(n_ubatch)}.get(mode)
        if split is None:
            raise ValueError(f"unknown split mode {mode!r} (simple, equal or seq)")
        self.split_reset()
        ubatches = []
        while (ub := split()) is not None:
            ubatches.append(ub)
        if self.n_used < self.n_tokens:
            return None
        return ubatches

    def _ubatch_add(self, idxs: list[int], n_seqs: int, equal_seqs: bool,
                    mark_used: bool = True) -> UBatch:
        ix = np.asarray(idxs, dtype=np.int64)
        if mark_used:
            self.used[ix] = True
            self.n_used += len(ix)
        output = self.output[ix].copy()
        self.out_ids.extend(int(i) for i in ix[output])
        seq_ids = [self.seq_ids[i] for i in idxs]
        unq = sorted({s for seqs in seq_ids for s in seqs})
        return UBatch(
            tokens=None if self.tokens is None else self.tokens[ix].copy(),
            embd=None if self.embd is None else self.embd[ix].copy(),
            pos=self.pos[ix].copy(), seq_ids=seq_ids, output=output, idxs=ix,
            n_seq_tokens=len(idxs) // n_seqs, n_seqs=n_seqs, equal_seqs=equal_seqs,
            seq_id_unq=unq)


class BatchAllocator:
    """llama_batch_allocr: validates a `Batch` and fills its missing fields."""

    @staticmethod
    def init(batch: Batch, n_vocab: int, n_seq_max: int, memory: SeqPosMemory | None = None,
             output_all: bool = False, n_embd: int | None = None) -> AllocatedBatch:
        """Validate `batch` and fill it in; raise BatchError naming the field and index.

        Missing positions continue each sequence after `memory.seq_pos_max(seq)` (from 0
        without a memory); missing sequence ids are 0; missing output flags mark only the last
        token (every token with `output_all`, which also overrides flags given as False).
        """
        if not isinstance(batch, Batch):
            raise BatchError(f"expected a Batch, got {type(batch).__name__}", "batch")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQ:
            raise BatchError(f"n_seq_max = {n_seq_max} is not in [1, {LLAMA_MAX_SEQ}]",
                             "n_seq_max")
        tokens, embd = _read_inputs(batch, n_vocab, n_embd)
        n = len(tokens) if tokens is not None else len(embd)
        seq_ids = _read_seq_ids(batch.seq_ids, n, n_seq_max)
        if batch.pos is None:
            pos = _fill_pos(seq_ids, memory, n_seq_max)
        else:
            pos = _read_pos(batch.pos, n)
        output = _read_logits(batch.logits, n, output_all)

        seq_sets = [sum(1 << s for s in seqs) for seqs in seq_ids]
        coupled = {(s1, seqs[0]) for seqs in seq_ids for s1 in seqs[1:]}
        ab = AllocatedBatch(tokens=tokens, embd=embd, pos=pos, seq_ids=seq_ids, output=output,
                            n_seq_max=n_seq_max, seq_sets=seq_sets,
                            seq_id_unq=sorted({s for seqs in seq_ids for s in seqs}),
                            coupled=coupled)
        _check_positions(ab, memory)
        _check_seq_order(ab)
        return ab


# -- validation helpers ------------------------------------------------------------------------

def _check_n_ubatch(n_ubatch: int) -> None:
    if int(n_ubatch) < 1:
        raise ValueError(f"n_ubatch = {n_ubatch} must be at least 1")


def _as_int_array(values, name: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.size and not np.issubdtype(values.dtype, np.integer):
            raise BatchError(f"{name} must hold integers, got dtype {values.dtype}", name)
    else:
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise BatchError(f"{name}[{i}] = {v!r} is not an integer", name, i)
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim != 1:
        raise BatchError(f"{name} must be one-dimensional, got shape {arr.shape}", name)
    return arr


def _read_inputs(batch: Batch, n_vocab: int,
                 n_embd: int | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    if batch.tokens is not None and batch.embd is not None:
        raise BatchError("a batch holds either tokens or embd, not both", "embd")
    if batch.tokens is None and batch.embd is None:
        raise BatchError("the batch has neither tokens nor embd", "tokens")
    if batch.tokens is not None:
        tok = _as_int_array(batch.tokens, "tokens")
        if len(tok) == 0:
            raise BatchError("the batch is empty (n_tokens = 0)", "tokens")
        bad = np.flatnonzero((tok < 0) | (tok >= n_vocab))
        if len(bad):
            i = int(bad[0])
            raise BatchError(f"tokens[{i}] = {tok[i]} is out of range [0, {n_vocab})",
                             "tokens", i)
        return tok.astype(np.int32), None
    embd = np.asarray(batch.embd)
    if embd.ndim != 2:
        raise BatchError(f"embd must be 2-D (n_tokens x n_embd), got shape {embd.shape}", "embd")
    if embd.shape[0] == 0:
        raise BatchError("the batch is empty (n_tokens = 0)", "embd")
    if n_embd is not None and embd.shape[1] != n_embd:
        raise BatchError(f"embd has {embd.shape[1]} columns, the model has n_embd = {n_embd}",
                         "embd")
    if not np.issubdtype(embd.dtype, np.floating):
        raise BatchError(f"embd must hold floats, got dtype {embd.dtype}", "embd")
    return None, np.ascontiguousarray(embd, dtype=np.float32)


def _check_length(values, n: int, name: str) -> None:
    if len(values) != n:
        raise BatchError(f"{name} has {len(values)} entries but the batch has {n} tokens", name)


def _read_seq_ids(values, n: int, n_seq_max: int) -> list[tuple[int, ...]]:
    if values is None:
        return [(0,)] * n
    if isinstance(values, np.ndarray) and values.ndim == 2:
        values = values.tolist()
    _check_length(values, n, "seq_ids")
    out = []
    for i, entry in enumerate(values):
        seqs = (entry,) if isinstance(entry, (int, np.integer)) else tuple(entry)
        if not seqs:
            raise BatchError(f"seq_ids[{i}] is empty: a token needs a sequence", "seq_ids", i)
        for k, s in enumerate(seqs):
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
                raise BatchError(f"seq_ids[{i}][{k}] = {s!r} is not an integer", "seq_ids", i)
            if not 0 <= s < n_seq_max:
                raise BatchError(f"seq_ids[{i}][{k}] = {s} is out of range [0, n_seq_max = "
                                 f"{n_seq_max})", "seq_ids", i)
        if len(set(seqs)) != len(seqs):
            raise BatchError(f"seq_ids[{i}] = {list(seqs)} repeats a sequence id", "seq_ids", i)
        out.append(tuple(int(s) for s in seqs))
    return out


def _read_pos(values, n: int) -> np.ndarray:
    _check_length(values, n, "pos")
    pos = _as_int_array(values, "pos")
    bad = np.flatnonzero((pos < 0) | (pos >= POS_MAX))
    if len(bad):
        i = int(bad[0])
        raise BatchError(f"pos[{i}] = {pos[i]} is out of range [0, {POS_MAX})", "pos", i)
    return pos.astype(np.int32)


def _fill_pos(seq_ids: list[tuple[int, ...]], memory: SeqPosMemory | None,
              n_seq_max: int) -> np.ndarray:
    """Each token takes the next position of its first sequence; all its sequences advance."""
    nxt = [0 if memory is None else memory.seq_pos_max(s) + 1 for s in range(n_seq_max)]
    pos = np.empty(len(seq_ids), dtype=np.int32)
    for i, seqs in enumerate(seq_ids):
        pos[i] = nxt[seqs[0]]
        for s in seqs:
            nxt[s] = int(pos[i]) + 1
    return pos


def _read_logits(values, n: int, output_all: bool) -> np.ndarray:
    if values is None:
        out = np.full(n, output_all, dtype=bool)
        out[-1] = True
        return out
    _check_length(values, n, "logits")
    out = np.asarray(values)
    flags = out.dtype == bool or np.issubdtype(out.dtype, np.integer)
    if out.ndim != 1 or (out.size and not flags):
        raise BatchError("logits must be a list of booleans (output flags)", "logits")
    if output_all:
        return np.ones(n, dtype=bool)
    return out.astype(bool)


def _check_positions(ab: AllocatedBatch, memory: SeqPosMemory | None) -> None:
    """The batch positions of every sequence continue the memory and have no holes."""
    for s in ab.seq_id_unq:
        lo, hi = ab.seq_pos_min(s), ab.seq_pos_max(s)
        last = memory.seq_pos_max(s) if memory is not None else -1
        if last >= 0 and lo != last + 1:
            raise BatchError(
                f"pos: the tokens of sequence {s} start at position Y = {lo}, but the last "
                f"position stored in the memory is X = {last}; positions must continue "
                f"(Y = X + 1)", "pos", _first_index(ab, s, lo))
        if hi - lo + 1 > len(ab._seq_pos[s]):
            raise BatchError(f"pos: the positions of sequence {s} in the batch are not "
                             f"continuous (range [{lo}, {hi}] has holes)", "pos")
    if memory is not None:
        for s1, s0 in sorted(ab.coupled):
            if (memory.seq_pos_min(s0) != memory.seq_pos_min(s1)
                    or memory.seq_pos_max(s0) != memory.seq_pos_max(s1)):
                raise BatchError(f"seq_ids: sequence {s1} is coupled to {s0} in the batch, but "
                                 f"they have diverged in the memory", "seq_ids")


def _first_index(ab: AllocatedBatch, seq: int, pos: int) -> int | None:
    for i, seqs in enumerate(ab.seq_ids):
        if seq in seqs and ab.pos[i] == pos:
            return i
    return None


def _check_seq_order(ab: AllocatedBatch) -> None:
    """Sequence sets narrow and positions do not decrease, per sequence, in batch order."""
    cur_set: dict[int, int] = {}
    cur_pos: dict[int, int] = {}
    for i, (mask, seqs) in enumerate(zip(ab.seq_sets, ab.seq_ids)):
        p = int(ab.pos[i])
        for s in seqs:
            prev = cur_set.get(s, mask)
            if mask & prev != mask:
                raise BatchError(f"seq_ids[{i}] = {list(seqs)}: sequence {s} belongs to "
                                 f"incompatible sequence sets (a set may only narrow)",
                                 "seq_ids", i)
            if p < cur_pos.get(s, -1):
                raise BatchError(f"pos[{i}] = {p}: the positions of sequence {s} decrease "
                                 f"(previous {cur_pos[s]})", "pos", i)
            cur_set[s] = mask
            cur_pos[s] = p
