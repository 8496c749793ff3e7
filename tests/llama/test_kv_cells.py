"""KV cell bookkeeping against llama.cpp's llama-kv-cells.h / llama-kv-cache.cpp semantics:
hand-worked examples, plus random operation sequences checked against a small independent
list-of-cells model written here."""
from __future__ import annotations

import random

import numpy as np
import pytest

from llama.batch import Batch, BatchAllocator, BatchError, UBatch
from llama.kv_cells import KVCells, SlotInfo, SWAType, is_masked_swa

NEG = -np.inf


def ub(pos, seqs) -> UBatch:
    """A simple-split ubatch with the given positions and sequences (one int or a list)."""
    seq_ids = [(s,) if isinstance(s, int) else tuple(s) for s in seqs]
    n = len(pos)
    return UBatch(tokens=np.zeros(n, np.int32), embd=None, pos=np.asarray(pos, np.int32),
                  seq_ids=seq_ids, output=np.zeros(n, bool), idxs=np.arange(n),
                  n_seq_tokens=1, n_seqs=n, equal_seqs=False,
                  seq_id_unq=sorted({s for t in seq_ids for s in t}))


def place(kv: KVCells, pos, seqs) -> SlotInfo:
    u = ub(pos, seqs)
    slot = kv.find_slot(u)
    assert slot is not None
    kv.apply_ubatch(slot, u)
    return slot


def brute_minmax(kv: KVCells, s: int) -> tuple[int, int]:
    ps = kv.pos[kv.seq[:, s] & (kv.pos >= 0)]
    return (int(ps.min()), int(ps.max())) if len(ps) else (-1, -1)


def check_consistent(kv: KVCells) -> None:
    for s in range(kv.n_seq_max):
        assert (kv.seq_pos_min(s), kv.seq_pos_max(s)) == brute_minmax(kv, s)
    assert not kv.seq[kv.pos < 0].any()
    assert (kv.seq[kv.pos >= 0].any(axis=1)).all()


# -- slots ---------------------------------------------------------------------------------

def test_apply_ubatch_writes_cells_and_moves_head():
    kv = KVCells(8, 2)
    slot = place(kv, [0, 1, 0], [0, 0, [0, 1]])
    assert slot.idxs.tolist() == [0, 1, 2] and kv.head == 3
    assert kv.pos.tolist()[:4] == [0, 1, 0, -1]
    assert kv.seq[2].tolist() == [True, True]
    assert kv.used == 3 and kv.used_max_p1() == 3
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0)) == (0, 1)
    assert (kv.seq_pos_min(1), kv.seq_pos_max(1)) == (0, 0)
    check_consistent(kv)


def test_find_slot_on_a_fragmented_cache():
    kv = KVCells(8, 1)
    place(kv, list(range(8)), [0] * 8)
    assert kv.find_slot(ub([8], [0])) is None             # full
    kv.seq_rm(0, 2, 4)                                     # frees cells 2, 3; head -> 2
    kv.seq_rm(0, 6, 7)                                     # frees cell 6
    assert kv.head == 2
    assert kv.find_slot(ub([8, 9, 10], [0] * 3)).idxs.tolist() == [2, 3, 6]
    assert kv.find_slot(ub([8, 9, 10, 11], [0] * 4)) is None
    assert kv.find_slot(ub([8, 9], [0] * 2), cont=True).idxs.tolist() == [2, 3]
    assert kv.find_slot(ub([8, 9, 10], [0] * 3), cont=True) is None
    # the search starts at the head and wraps around
    kv.head = 5
    assert kv.find_slot(ub([8, 9], [0] * 2)).idxs.tolist() == [6, 2]
    assert kv.find_slot(ub(list(range(9)), [0] * 9)) is None   # more tokens than cells


def test_find_slot_restarts_from_zero_when_the_head_is_far():
    kv = KVCells(32, 1)
    kv.head = 20                       # 20 > used (0) + 2 * n_tokens (2)
    assert kv.find_slot(ub([0], [0])).idxs.tolist() == [0]
    kv.head = 2                        # 2 <= 2: keep the head
    assert kv.find_slot(ub([0], [0])).idxs.tolist() == [2]


def test_prepare_is_all_or_nothing():
    kv = KVCells(8, 1)
    place(kv, [0, 1], [0, 0])
    before = (kv.pos.copy(), kv.seq.copy(), kv.head, kv.seq_pos_max(0))
    slots = kv.prepare([ub([2, 3, 4], [0] * 3), ub([5, 6, 7], [0] * 3)])
    assert [s.idxs.tolist() for s in slots] == [[2, 3, 4], [5, 6, 7]]
    # the second ubatch does not fit: no slots, and nothing changed either way
    assert kv.prepare([ub([2, 3, 4], [0] * 3), ub([5, 6, 7, 8], [0] * 4)]) is None
    after = (kv.pos, kv.seq, kv.head, kv.seq_pos_max(0))
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])
    assert after[2:] == before[2:]
    check_consistent(kv)


def test_decode_flow_with_the_batch_allocator():
    kv = KVCells(16, 2, n_pad=4)
    ab = BatchAllocator.init(Batch(tokens=[1, 2, 3, 4, 5], seq_ids=[0, 1, 0, 1, 0]), 10, 2, kv)
    ubs = ab.split_all(4, "simple")
    slots = kv.prepare(ubs)
    for slot, u in zip(slots, ubs):
        kv.apply_ubatch(slot, u)
    assert [kv.seq_pos_max(s) for s in (0, 1)] == [2, 1]
    assert kv.get_n_kv() == 8
    # the next batch continues both sequences; a wrong start is refused
    ab = BatchAllocator.init(Batch(tokens=[1, 2], seq_ids=[1, 0]), 10, 2, kv)
    assert ab.pos.tolist() == [2, 3]
    with pytest.raises(BatchError, match="X = 2"):
        BatchAllocator.init(Batch(tokens=[1], pos=[5], seq_ids=[0]), 10, 2, kv)


# -- sequence operations -------------------------------------------------------------------

def filled() -> KVCells:
    """cells 0..3: seq 0 and 1 share positions 0..3 (a prompt); 4..5: seq 0 at 4, 5;
    6..7: seq 1 at 4, 5."""
    kv = KVCells(10, 3)
    place(kv, [0, 1, 2, 3, 4, 5, 4, 5], [[0, 1]] * 4 + [0, 0, 1, 1])
    return kv


def test_seq_rm_of_one_sequence_keeps_shared_cells():
    kv = filled()
    assert kv.seq_rm(0, 2, -1) is True
    assert kv.pos.tolist() == [0, 1, 2, 3, -1, -1, 4, 5, -1, -1]
    assert kv.seq[2].tolist() == [False, True, False]
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0)) == (0, 1)
    assert (kv.seq_pos_min(1), kv.seq_pos_max(1)) == (0, 5)
    assert kv.head == 4 and kv.used == 6
    check_consistent(kv)


def test_seq_rm_any_sequence_and_open_ranges():
    kv = filled()
    kv.seq_rm(-1, 1, 5)                    # every cell with pos in [1, 5)
    assert kv.pos.tolist() == [0, -1, -1, -1, -1, 5, -1, 5, -1, -1]
    assert [kv.seq_pos_max(s) for s in range(3)] == [5, 5, -1]
    assert [kv.seq_pos_min(s) for s in range(3)] == [0, 0, -1]
    kv.seq_rm(1, -1, -1)                   # all of seq 1
    assert kv.pos.tolist() == [0, -1, -1, -1, -1, 5, -1, -1, -1, -1]
    assert kv.seq_pos_max(1) == -1 and kv.head == 1
    check_consistent(kv)
    with pytest.raises(ValueError, match="sequence id 3"):
        kv.seq_rm(3, 0, 1)


def test_seq_cp_shares_cells_without_new_ones():
    kv = filled()
    kv.seq_cp(0, 2, 2, 5)                  # seq 0 cells with pos 2, 3, 4
    assert np.flatnonzero(kv.seq[:, 2]).tolist() == [2, 3, 4]
    assert (kv.seq_pos_min(2), kv.seq_pos_max(2)) == (2, 4)
    assert kv.used == 8
    kv.seq_cp(0, 2)                        # whole range, already shared cells stay as they are
    assert np.flatnonzero(kv.seq[:, 2]).tolist() == [0, 1, 2, 3, 4, 5]
    assert (kv.seq_pos_min(2), kv.seq_pos_max(2)) == (0, 5)
    kv.seq_rm(2, 0, 3)
    assert kv.seq_pos_min(2) == 3
    check_consistent(kv)


def test_seq_keep_frees_cells_of_other_sequences():
    kv = filled()
    kv.head = 8
    kv.seq_keep(1)
    assert kv.pos.tolist() == [0, 1, 2, 3, -1, -1, 4, 5, -1, -1]
    assert not kv.seq[:, 0].any() and kv.seq[:4, 1].all()
    assert kv.seq_pos_max(0) == -1 and (kv.seq_pos_min(1), kv.seq_pos_max(1)) == (0, 5)
    assert kv.head == 4
    check_consistent(kv)


def test_seq_add_context_shift_and_negative_positions():
    kv = KVCells(8, 1)
    place(kv, list(range(6)), [0] * 6)
    # the context shift of llama.cpp's examples: drop [1, 3), move [3, end) back by 2
    kv.seq_rm(0, 1, 3)
    kv.seq_add(0, 3, -1, -2)
    assert kv.pos.tolist() == [0, -1, -1, 1, 2, 3, -1, -1]
    assert kv.has_shift and kv.shift.tolist()[:6] == [0, 0, 0, -2, -2, -2]
    assert kv.k_shift().tolist() == [0, 0, 0, -2, -2, -2, 0, 0]
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0)) == (0, 3)
    assert kv.head == 0                    # nothing freed: search from the start
    # a shift below 0 removes the cell
    kv.seq_add(0, 0, 2, -1)                # cells with pos 0, 1 -> -1 (removed), 0
    assert kv.pos.tolist() == [-1, -1, -1, 0, 2, 3, -1, -1]
    assert kv.head == 0 and kv.shift[3] == -3 and kv.shift[0] == 0
    kv.reset_shift()
    assert not kv.has_shift and not kv.shift.any()
    check_consistent(kv)


def test_seq_add_moves_shared_cells_and_keeps_duplicate_positions():
    kv = KVCells(8, 2)
    place(kv, [0, 1, 2, 3], [[0, 1], [0, 1], 0, 0])
    kv.seq_add(0, 2, -1, -2)               # seq 0 now has position 0 and 1 twice
    assert kv.pos.tolist()[:4] == [0, 1, 0, 1]
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0)) == (0, 1)
    kv.seq_rm(0, 0, 1)                     # both cells at 0: cell 0 keeps seq 1, cell 2 frees
    assert kv.pos.tolist()[:4] == [0, 1, -1, 1] and kv.seq[0].tolist() == [False, True]
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0)) == (1, 1)
    kv.seq_add(1, 0, 1, 5)                 # moving seq 1's cell 0 (pos 0 -> 5)
    assert kv.seq_pos_max(1) == 5 and kv.seq_pos_min(1) == 1
    kv.seq_add(0, 0, -1, 0)                # delta 0: nothing at all
    check_consistent(kv)


def test_seq_div():
    kv = KVCells(8, 1)
    place(kv, [0, 1, 2, 3, 4, 5], [0] * 6)
    kv.seq_div(0, 2, -1, 2)
    assert kv.pos.tolist()[:6] == [0, 1, 1, 1, 2, 2]
    assert kv.shift.tolist()[:6] == [0, 0, 1, 2, 2, 3]
    assert (kv.seq_pos_min(0), kv.seq_pos_max(0)) == (0, 2)
    with pytest.raises(ValueError, match="divisor"):
        kv.seq_div(0, 0, -1, 0)
    check_consistent(kv)


def test_clear_and_snapshot_restore():
    kv = filled()
    state = kv.snapshot()
    kv.seq_rm(-1, -1, -1)
    assert kv.used == 0
    place(kv, [0], [2])
    kv.restore(state)
    assert kv.pos.tolist() == [0, 1, 2, 3, 4, 5, 4, 5, -1, -1]
    assert kv.seq_pos_max(2) == -1 and kv.seq_pos_max(1) == 5
    kv.clear()
    assert kv.used == 0 and kv.head == 0 and [kv.seq_pos_max(s) for s in range(3)] == [-1] * 3
    check_consistent(kv)
    with pytest.raises(ValueError, match="another size"):
        KVCells(4, 3).restore(state)


class RefCells:
    """Independent model: a list of [pos, set(seqs), shift] cells, llama.cpp's loops."""

    def __init__(self, size):
        self.cells = [[-1, set(), 0] for _ in range(size)]

    def put(self, idxs, pos, seqs):
        for i, p, s in zip(idxs, pos, seqs):
            self.cells[i] = [p, set(s), 0]

    def seq_rm(self, s, p0, p1):
        p1 = 2**31 - 1 if p1 < 0 else p1
        for c in self.cells:
            if c[0] >= 0 and max(p0, 0) <= c[0] < p1 and (s == -1 or s in c[1]):
                c[1] = set() if s == -1 else c[1] - {s}
                if not c[1]:
                    c[:] = [-1, set(), 0]

    def seq_cp(self, a, b, p0, p1):
        p1 = 2**31 - 1 if p1 < 0 else p1
        for c in self.cells:
            if a in c[1] and max(p0, 0) <= c[0] < p1:
                c[1].add(b)

    def seq_keep(self, s):
        for c in self.cells:
            if s in c[1]:
                c[1] = {s}
            elif c[0] >= 0:
                c[:] = [-1, set(), 0]

    def seq_add(self, s, p0, p1, d):
        p1 = 2**31 - 1 if p1 < 0 else p1
        for c in self.cells:
            if d and s in c[1] and max(p0, 0) <= c[0] < p1:
                c[0] += d
                c[2] += d
                if c[0] < 0:
                    c[:] = [-1, set(), 0]


@pytest.mark.parametrize("seq_block", [0, 4], ids=["llama.cpp placement", "sequence blocks"])
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_reference_model(seed, seq_block):
    rng = random.Random(seed)
    kv, ref = KVCells(24, 3, seq_block=seq_block), RefCells(24)
    next_pos = [0, 0, 0]
    for _ in range(80):
        op = rng.choice(["put", "put", "rm", "cp", "keep", "add"])
        s = rng.randrange(3)
        p0, p1 = rng.randrange(-1, 12), rng.randrange(-1, 16)
        if op == "put":
            n = rng.randrange(1, 5)
            pos = [next_pos[s] + k for k in range(n)]
            u = ub(pos, [s] * n)
            slot = kv.find_slot(u)
            if slot is None:
                assert kv.size - kv.used < n
                continue
            assert all(ref.cells[i][0] == -1 for i in slot.idxs.tolist())
            kv.apply_ubatch(slot, u)
            ref.put(slot.idxs.tolist(), pos, [[s]] * n)
            next_pos[s] += n
        elif op == "rm":
            target = s if rng.random() < 0.8 else -1
            kv.seq_rm(target, p0, p1)
            ref.seq_rm(target, p0, p1)
        elif op == "cp":
            t = rng.randrange(3)
            kv.seq_cp(s, t, p0, p1)
            if s != t:
                ref.seq_cp(s, t, p0, p1)
        elif op == "keep":
            kv.seq_keep(s)
            ref.seq_keep(s)
        else:
            d = rng.randrange(-4, 5)
            kv.seq_add(s, p0, p1, d)
            ref.seq_add(s, p0, p1, d)
        assert kv.pos.tolist() == [c[0] for c in ref.cells]
        assert [set(np.flatnonzero(row).tolist()) for row in kv.seq] == [c[1] for c in ref.cells]
        assert kv.k_shift().tolist() == [c[2] for c in ref.cells]
        check_consistent(kv)


# -- sequence blocks -----------------------------------------------------------------------

def owners_per_block(kv: KVCells, n: int | None = None) -> list[set[int]]:
    """The sequences holding cells in each block of n (kv.seq_block) cells."""
    n = n or kv.seq_block
    return [set(np.flatnonzero(kv.seq[i:i + n].any(axis=0)).tolist()) for i in range(0, kv.size, n)]


def cells_in_position_order(kv: KVCells, s: int) -> list[int]:
    cells = np.flatnonzero(kv.seq[:, s])
    return cells[np.argsort(kv.pos[cells], kind="stable")].tolist()


def test_sequence_blocks_keep_each_sequence_in_blocks_of_its_own():
    """Prompts and then interleaved one-token steps of three sequences (the server's step):
    every block holds one sequence, each continues where it left off, and the masks are
    the ones llama.cpp's placement gives, column for column."""
    kv, plain = KVCells(96, 3, seq_block=8), KVCells(96, 3)
    prompts = {0: 5, 1: 3, 2: 10}
    for cells in (kv, plain):
        for s, n in prompts.items():
            place(cells, list(range(n)), [s] * n)
    assert cells_in_position_order(kv, 0) == [0, 1, 2, 3, 4]       # the first block
    assert cells_in_position_order(kv, 1) == [8, 9, 10]            # a block of its own
    assert cells_in_position_order(kv, 2) == list(range(16, 26))   # two blocks, in a row
    for step in range(12):
        u = ub([prompts[s] + step for s in range(3)], [0, 1, 2])
        for cells in (kv, plain):
            cells.apply_ubatch(cells.find_slot(u), u)
        check_consistent(kv)
    assert all(len(owners) <= 1 for owners in owners_per_block(kv))
    assert all(len(owners) > 1 for owners in owners_per_block(plain, 8)[3:5])   # llama.cpp's: interleaved
    for s in range(3):
        order = cells_in_position_order(kv, s)
        assert sorted(order) == order                              # positions follow the cells
        assert kv.pos[order].tolist() == list(range(prompts[s] + 12))
    # what each token sees is the same set of (sequence, position) pairs either way
    u = ub([prompts[s] + 12 for s in range(3)], [0, 1, 2])
    for cells in (kv, plain):
        cells.apply_ubatch(cells.find_slot(u), u)
    ma, mb = kv.kq_mask(u, 96), plain.kq_mask(u, 96)
    for t in range(3):
        seen_a = sorted(kv.pos[np.isfinite(ma[t])].tolist())
        seen_b = sorted(plain.pos[np.isfinite(mb[t])].tolist())
        assert seen_a == seen_b == list(range(prompts[t] + 13))


def test_sequence_blocks_fall_back_to_any_free_cell():
    """With no wholly free block left, a token goes to the first usable cell from the head
    (llama.cpp's placement); None only when the cache has no room."""
    kv = KVCells(16, 2, seq_block=8)
    place(kv, list(range(6)), [0] * 6)
    place(kv, list(range(6)), [1] * 6)
    assert cells_in_position_order(kv, 1) == list(range(8, 14))
    slot = place(kv, [6, 7, 8], [0, 0, 0])
    assert slot.idxs.tolist() == [6, 7, 14]     # its block's last two cells, then the head
    assert kv.find_slot(ub([6, 7], [1, 1])) is None    # one cell left for two tokens
    assert kv.find_slot(ub([6], [1])).idxs.tolist() == [15]


def test_sequence_blocks_after_a_shared_prefix():
    """seq_cp shares the prompt's cells; each sequence's own tokens then go to blocks of
    their own (the prefix's block goes on with its first owner)."""
    kv = KVCells(64, 3, seq_block=8)
    place(kv, list(range(10)), [[0, 1, 2]] * 10)          # one shared prompt, cells 0..9
    for step in range(5):
        u = ub([10 + step] * 3, [0, 1, 2])
        kv.apply_ubatch(kv.find_slot(u), u)
    own = {s: [c for c in cells_in_position_order(kv, s) if c >= 10] for s in range(3)}
    assert own[0] == [10, 11, 12, 13, 14]                 # after the last shared cell
    assert own[1] == list(range(16, 21)) and own[2] == list(range(24, 29))
    check_consistent(kv)


def test_sequence_blocks_in_a_sliding_window_cache():
    """A window cache with blocks: each sequence reuses its own cells that fell out of the
    window, and every token still sees its whole window."""
    n_swa = 6
    kv = KVCells(32, 2, swa_type=SWAType.STANDARD, n_swa=n_swa, seq_block=4)
    for p in range(40):
        u = ub([p, p], [0, 1])
        slot = kv.find_slot(u)
        assert slot is not None, f"position {p}"
        kv.apply_ubatch(slot, u)
        m = kv.kq_mask(u, 32)
        for t in range(2):
            seen = sorted(kv.pos[np.isfinite(m[t])].tolist())
            assert seen == list(range(max(0, p - n_swa + 1), p + 1))
        check_consistent(kv)
    assert all(len(owners) <= 1 for owners in owners_per_block(kv))


def test_sequence_block_argument_is_checked():
    with pytest.raises(ValueError, match="seq_block"):
        KVCells(8, 2, seq_block=-1)


# -- graph inputs --------------------------------------------------------------------------

def test_kq_mask_two_sequences_interleaved_causal():
    kv = KVCells(16, 2, n_pad=8)
    place(kv, [0, 1, 0], [0, 0, 1])                         # cells 0, 1: seq 0; cell 2: seq 1
    u = ub([2, 1, 3, 2], [0, 1, 0, 1])                       # interleaved continuation
    slot = place_ub(kv, u)
    assert slot.idxs.tolist() == [3, 4, 5, 6]
    n_kv = kv.get_n_kv()
    assert n_kv == 8
    o, x = 0.0, NEG
    expected = np.array([
        # cell: 0  1  2  3  4  5  6  7      (pos 0 1 0 2 1 3 2 -, seq 0 0 1 0 1 0 1 -)
        [o, o, x, o, x, x, x, x],          # seq 0 at 2
        [x, x, o, x, o, x, x, x],          # seq 1 at 1
        [o, o, x, o, x, o, x, x],          # seq 0 at 3
        [x, x, o, x, o, x, o, x],          # seq 1 at 2
    ], dtype=np.float32)
    mask = kv.kq_mask(u, n_kv)
    assert mask.dtype == np.float32 and mask.shape == (4, 8)
    np.testing.assert_array_equal(mask, expected)
    # without the causal rule every cell of the token's sequence is visible
    nc = kv.kq_mask(u, n_kv, causal=False)
    np.testing.assert_array_equal(nc[0], [o, o, x, o, x, o, x, x])
    np.testing.assert_array_equal(nc[1], [x, x, o, x, o, x, o, x])


def test_kq_mask_shared_token_uses_its_first_sequence():
    kv = KVCells(8, 2, n_pad=4)
    place(kv, [0, 1], [[0, 1], 1])
    u = ub([1], [[0, 1]])                                   # seen as seq 0
    place_ub(kv, u)
    np.testing.assert_array_equal(kv.kq_mask(u, 4)[0], [0, NEG, 0, NEG])


def place_ub(kv: KVCells, u: UBatch) -> SlotInfo:
    slot = kv.find_slot(u)
    kv.apply_ubatch(slot, u)
    return slot


def scalar_mask(kv, u, n_kv, causal, swa_type, n_swa):
    """llama.cpp's set_input_kq_mask loop with the window rules written out per type."""
    out = np.full((u.n_tokens, n_kv), NEG, np.float32)
    for i in range(u.n_tokens):
        s, p1 = u.seq_ids[i][0], int(u.pos[i])
        for j in range(n_kv):
            p0 = int(kv.pos[j])
            if p0 < 0 or not kv.seq[j, s] or (causal and p0 > p1):
                continue
            if swa_type == SWAType.STANDARD and p1 - p0 >= n_swa:
                continue
            if swa_type == SWAType.CHUNKED and p0 < (p1 // n_swa) * n_swa:
                continue
            if swa_type == SWAType.SYMMETRIC and abs(p1 - p0) > n_swa // 2:
                continue
            out[i, j] = 0.0
    return out


def test_swa_masks_hand_worked():
    kv = KVCells(8, 1, n_pad=8)
    place(kv, list(range(6)), [0] * 6)
    u = ub([3, 5], [0, 0])
    row = lambda m, i: [int(v == 0) for v in m[i]]          # noqa: E731
    std = kv.kq_mask(u, 8, swa_type=SWAType.STANDARD, n_swa=3)
    assert row(std, 0) == [0, 1, 1, 1, 0, 0, 0, 0] and row(std, 1) == [0, 0, 0, 1, 1, 1, 0, 0]
    chk = kv.kq_mask(u, 8, swa_type=SWAType.CHUNKED, n_swa=4)
    assert row(chk, 0) == [1, 1, 1, 1, 0, 0, 0, 0] and row(chk, 1) == [0, 0, 0, 0, 1, 1, 0, 0]
    sym = kv.kq_mask(u, 8, causal=False, swa_type=SWAType.SYMMETRIC, n_swa=4)
    assert row(sym, 0) == [0, 1, 1, 1, 1, 1, 0, 0] and row(sym, 1) == [0, 0, 0, 1, 1, 1, 0, 0]
    # the cache's own window is the default; SWAType.NONE turns it off
    swa_kv = KVCells(8, 1, n_pad=8, swa_type=SWAType.STANDARD, n_swa=3)
    place(swa_kv, list(range(6)), [0] * 6)
    np.testing.assert_array_equal(swa_kv.kq_mask(u, 8), std)
    assert row(swa_kv.kq_mask(u, 8, swa_type=SWAType.NONE), 1) == [1] * 6 + [0, 0]


@pytest.mark.parametrize("swa_type", list(SWAType))
@pytest.mark.parametrize("causal", [True, False])
def test_masks_match_scalar_loop(swa_type, causal):
    rng = np.random.default_rng(int(swa_type) * 2 + causal)
    kv = KVCells(40, 3, n_pad=16)
    for s in range(3):
        place(kv, list(range(9)), [s] * 9)
    kv.seq_rm(1, 2, 4)
    kv.seq_cp(0, 2, 0, 3)
    u = ub(rng.integers(0, 12, 7).tolist(), rng.integers(0, 3, 7).tolist())
    n_swa = 0 if swa_type == SWAType.NONE else 4
    got = kv.kq_mask(u, kv.get_n_kv(), causal=causal, swa_type=swa_type, n_swa=n_swa)
    want = scalar_mask(kv, u, kv.get_n_kv(), causal, swa_type, n_swa)
    np.testing.assert_array_equal(got, want)


def test_is_masked_swa_scalar_values():
    assert is_masked_swa(4, SWAType.STANDARD, 1, 5) is True
    assert is_masked_swa(4, SWAType.STANDARD, 2, 5) is False
    assert is_masked_swa(4, SWAType.CHUNKED, 3, 4) is True
    assert is_masked_swa(4, SWAType.CHUNKED, 4, 7) is False
    assert is_masked_swa(4, SWAType.SYMMETRIC, 7, 5) is False
    assert is_masked_swa(4, SWAType.SYMMETRIC, 8, 5) is True
    assert is_masked_swa(0, SWAType.NONE, 0, 1000) is False


def test_swa_cache_overwrites_cells_outside_the_window():
    kv = KVCells(4, 1, swa_type=SWAType.STANDARD, n_swa=2)
    place(kv, [0, 1, 2, 3], [0] * 4)                        # full, head 4
    slot = place(kv, [4], [0])                               # p <= 2 usable; wraps to cell 0
    assert slot.idxs.tolist() == [0]
    assert kv.pos.tolist() == [4, 1, 2, 3] and kv.seq_pos_min(0) == 1
    assert place(kv, [5], [0]).idxs.tolist() == [1]
    # overwriting pos 4 while 2 and 3 are kept would leave a hole: they are purged
    kv2 = KVCells(4, 1, swa_type=SWAType.STANDARD, n_swa=2)
    place(kv2, [0, 1, 2, 3], [0] * 4)
    kv2.head = 2
    assert place(kv2, [4], [0]).idxs.tolist() == [2]
    assert kv2.pos.tolist() == [-1, -1, 4, 3]
    assert (kv2.seq_pos_min(0), kv2.seq_pos_max(0)) == (3, 4)
    check_consistent(kv2)
    # a cache without a window never overwrites
    kv3 = KVCells(4, 1)
    place(kv3, [0, 1, 2, 3], [0] * 4)
    assert kv3.find_slot(ub([4], [0])) is None


@pytest.mark.parametrize("size,n_pad,used,want", [
    (1024, 256, 0, 256), (1024, 256, 1, 256), (1024, 256, 256, 256), (1024, 256, 257, 512),
    (1024, 256, 1000, 1024), (100, 256, 30, 100), (1024, 32, 33, 64), (48, 32, 40, 48)])
def test_n_kv_padding(size, n_pad, used, want):
    kv = KVCells(size, 1, n_pad=n_pad)
    if used:
        kv.apply_ubatch(SlotInfo(np.array([used - 1])), ub([0], [0]))   # one cell, far out
        assert kv.used_max_p1() == used
    assert kv.get_n_kv() == want


def test_n_kv_padding_argument_overrides():
    kv = KVCells(1024, 1)
    place(kv, list(range(33)), [0] * 33)
    assert kv.get_n_kv() == 256 and kv.get_n_kv(32) == 64 and kv.get_n_kv(1) == 33


def test_k_and_v_indices():
    kv = KVCells(10, 1)
    slot = SlotInfo(np.array([7, 2, 3]))
    idx = kv.k_idxs(slot)
    assert idx.dtype == np.int64 and idx.tolist() == [7, 2, 3]
    assert kv.v_idxs(slot).tolist() == [7, 2, 3]
    # transposed V ([n_embd_v][size]): element j of token i lands at j * size + cell
    assert kv.v_idxs(slot, 2).tolist() == [7, 17, 2, 12, 3, 13]


def test_argument_errors():
    with pytest.raises(ValueError, match="n_swa > 0"):
        KVCells(8, 1, swa_type=SWAType.CHUNKED, n_swa=0)
    with pytest.raises(ValueError, match="unknown swa_type"):
        KVCells(8, 1, swa_type=7, n_swa=4)
    with pytest.raises(ValueError, match="size"):
        KVCells(0, 1)
    kv = KVCells(8, 2)
    with pytest.raises(ValueError, match="n_kv = 9"):
        kv.kq_mask(ub([0], [0]), 9)
    with pytest.raises(ValueError, match="sequence id 2"):
        kv.apply_ubatch(SlotInfo(np.array([0])), ub([0], [2]))
    with pytest.raises(ValueError, match="slot has 2 cells"):
        kv.apply_ubatch(SlotInfo(np.array([0, 1])), ub([0], [0]))
