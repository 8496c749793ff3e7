"""Batch allocation and ubatch splitting against llama.cpp's llama-batch.cpp semantics.

Every expected value below is worked out by hand from llama.cpp's rules (positions continue
seq_pos_max + 1, the last token is the default output, split orders)."""
from __future__ import annotations

import numpy as np
import pytest

from llama.batch import (LLAMA_MAX_SEQ, Batch, BatchAllocator, BatchError, UBatch)


class FakeMemory:
    """A memory holding the position range [lo, hi] of some sequences."""

    def __init__(self, ranges: dict[int, tuple[int, int]]):
        self.ranges = ranges

    def seq_pos_min(self, s: int) -> int:
        return self.ranges.get(s, (-1, -1))[0]

    def seq_pos_max(self, s: int) -> int:
        return self.ranges.get(s, (-1, -1))[1]


def alloc(batch, n_vocab=100, n_seq_max=4, memory=None, output_all=False, **kw):
    return BatchAllocator.init(batch, n_vocab, n_seq_max, memory, output_all, **kw)


# -- filling missing fields --------------------------------------------------------------------

def test_from_tokens_continues_memory_and_outputs_last_only():
    ab = alloc(Batch.from_tokens([5, 6, 7]), memory=FakeMemory({0: (0, 9)}))
    assert ab.pos.tolist() == [10, 11, 12]
    assert ab.output.tolist() == [False, False, True]
    assert ab.n_outputs == 1
    assert ab.seq_ids == [(0,), (0,), (0,)]
    assert ab.tokens.dtype == np.int32 and ab.tokens.tolist() == [5, 6, 7]


def test_from_tokens_explicit_pos0_seq_and_logits_all():
    b = Batch.from_tokens([1, 2], logits_all=True, seq_id=2, pos0=7)
    assert b.pos == [7, 8] and b.seq_ids == [[2], [2]] and b.logits == [True, True]
    ab = alloc(b)
    assert ab.n_outputs == 2 and ab.seq_id_unq == [2]


def test_missing_positions_without_memory_start_at_zero_per_sequence():
    ab = alloc(Batch(tokens=[1, 2, 3, 4, 5], seq_ids=[0, 1, 1, 0, 2]))
    assert ab.pos.tolist() == [0, 0, 1, 1, 0]


def test_missing_positions_follow_each_sequence_in_memory():
    mem = FakeMemory({0: (0, 9), 1: (0, 2)})
    ab = alloc(Batch(tokens=[1, 2, 3, 4], seq_ids=[0, 1, 1, 0]), memory=mem)
    assert ab.pos.tolist() == [10, 3, 4, 11]


def test_shared_tokens_advance_all_their_sequences():
    # a shared prompt of 2 tokens for seqs 0 and 1, then one token each, then seq 0 again
    ab = alloc(Batch(tokens=[1, 2, 3, 4, 5], seq_ids=[[0, 1], [0, 1], [0], [1], [0]]))
    assert ab.pos.tolist() == [0, 1, 2, 2, 3]
    assert ab.has_cpl and ab.coupled == {(1, 0)}
    assert ab.seq_sets == [0b11, 0b11, 0b01, 0b10, 0b01]


def test_missing_seq_ids_default_to_zero():
    ab = alloc(Batch(tokens=[3, 4], pos=[0, 1]))
    assert ab.seq_ids == [(0,), (0,)] and ab.seq_id_unq == [0]


def test_output_all_marks_every_token_and_overrides_given_flags():
    assert alloc(Batch(tokens=[1, 2, 3]), output_all=True).output.tolist() == [True] * 3
    b = Batch(tokens=[1, 2, 3], logits=[False, True, False])
    assert alloc(b).output.tolist() == [False, True, False]
    assert alloc(b).n_outputs == 1
    assert alloc(b, output_all=True).output.tolist() == [True] * 3


def test_given_positions_are_kept():
    ab = alloc(Batch(tokens=[1, 2, 3], pos=[4, 5, 6]), memory=FakeMemory({0: (0, 3)}))
    assert ab.pos.tolist() == [4, 5, 6]
    assert (ab.seq_pos_min(0), ab.seq_pos_max(0), ab.seq_pos_max(1)) == (4, 6, -1)


def test_embedding_batch_is_copied_as_float32():
    embd = np.arange(12, dtype=np.float64).reshape(3, 4)
    ab = alloc(Batch(embd=embd), n_embd=4)
    assert ab.tokens is None and ab.embd.dtype == np.float32
    np.testing.assert_array_equal(ab.embd, embd)
    assert Batch(embd=embd).n_tokens == 3


# -- validation errors -------------------------------------------------------------------------

@pytest.mark.parametrize("tokens,index", [([1, 100, 2], 1), ([-1, 2], 0), ([1, 2, 150], 2)])
def test_token_out_of_range(tokens, index):
    msg = rf"tokens\[{index}\] = -?\d+ is out of range \[0, 100\)"
    with pytest.raises(BatchError, match=msg) as e:
        alloc(Batch(tokens=tokens))
    assert e.value.field == "tokens" and e.value.index == index


def test_token_not_integer():
    with pytest.raises(BatchError, match=r"tokens\[1\] = 2.5 is not an integer"):
        alloc(Batch(tokens=[1, 2.5]))
    with pytest.raises(BatchError, match=r"tokens\[2\] = True is not an integer"):
        alloc(Batch(tokens=[1, 2, True]))
    with pytest.raises(BatchError, match="tokens must hold integers, got dtype float32"):
        alloc(Batch(tokens=np.ones(2, np.float32)))
    assert alloc(Batch(tokens=np.array([3, 4], np.int64))).tokens.tolist() == [3, 4]


@pytest.mark.parametrize("seq_ids,where", [([0, 4], "seq_ids[1][0] = 4"),
                                           ([[0, 1], [0, -1]], "seq_ids[1][1] = -1")])
def test_seq_id_out_of_range(seq_ids, where):
    with pytest.raises(BatchError, match=r"out of range \[0, n_seq_max = 4\)") as e:
        alloc(Batch(tokens=[1, 2], seq_ids=seq_ids))
    assert where in str(e.value) and e.value.field == "seq_ids" and e.value.index == 1


def test_seq_id_repeated_or_missing_in_a_token():
    with pytest.raises(BatchError, match=r"seq_ids\[0\] = \[1, 1\] repeats"):
        alloc(Batch(tokens=[1], seq_ids=[[1, 1]]))
    with pytest.raises(BatchError, match=r"seq_ids\[1\] is empty"):
        alloc(Batch(tokens=[1, 2], seq_ids=[[0], []]))


@pytest.mark.parametrize("field_name,kw", [
    ("pos", dict(pos=[0, 1])), ("seq_ids", dict(seq_ids=[0])),
    ("logits", dict(logits=[True, False, True, False]))])
def test_mismatched_lengths(field_name, kw):
    with pytest.raises(BatchError, match=rf"{field_name} has \d entries but the batch has 3") as e:
        alloc(Batch(tokens=[1, 2, 3], **kw))
    assert e.value.field == field_name


def test_empty_batch_and_missing_inputs():
    with pytest.raises(BatchError, match="empty"):
        alloc(Batch(tokens=[]))
    with pytest.raises(BatchError, match="empty"):
        alloc(Batch(embd=np.zeros((0, 4), np.float32)))
    with pytest.raises(BatchError, match="neither tokens nor embd"):
        alloc(Batch())
    with pytest.raises(BatchError, match="not both"):
        alloc(Batch(tokens=[1], embd=np.zeros((1, 4))))
    with pytest.raises(BatchError, match="n_embd = 8"):
        alloc(Batch(embd=np.zeros((2, 4))), n_embd=8)


def test_n_seq_max_limits():
    with pytest.raises(BatchError, match="n_seq_max"):
        alloc(Batch(tokens=[1]), n_seq_max=LLAMA_MAX_SEQ + 1)
    with pytest.raises(BatchError, match="n_seq_max"):
        alloc(Batch(tokens=[1]), n_seq_max=0)


def test_negative_position():
    with pytest.raises(BatchError, match=r"pos\[1\] = -2") as e:
        alloc(Batch(tokens=[1, 2], pos=[0, -2]))
    assert e.value.index == 1


@pytest.mark.parametrize("start", [3, 7, 0])
def test_positions_must_continue_the_memory(start):
    mem = FakeMemory({0: (0, 4)})
    with pytest.raises(BatchError, match=r"Y = X \+ 1") as e:
        alloc(Batch(tokens=[1, 2], pos=[start, start + 1]), memory=mem)
    assert e.value.field == "pos" and e.value.index == 0
    assert f"Y = {start}" in str(e.value) and "X = 4" in str(e.value)
    # the right start is accepted, and an empty sequence in memory accepts any start
    assert alloc(Batch(tokens=[1, 2], pos=[5, 6]), memory=mem).pos.tolist() == [5, 6]
    assert alloc(Batch(tokens=[1], pos=[9], seq_ids=[1]), memory=mem).pos.tolist() == [9]


def test_positions_must_have_no_holes():
    with pytest.raises(BatchError, match="sequence 1 .* not continuous"):
        alloc(Batch(tokens=[1, 2, 3], pos=[0, 1, 3], seq_ids=[1, 1, 1]))
    # holes in different sequences are fine
    alloc(Batch(tokens=[1, 2], pos=[0, 5], seq_ids=[0, 1]))


def test_positions_must_not_decrease_within_a_sequence():
    # llama.cpp's own example: seq 0 goes 4 5 6 3
    b = Batch(tokens=[1] * 7, pos=[4, 5, 0, 1, 6, 2, 3], seq_ids=[0, 0, 1, 1, 0, 1, 0])
    with pytest.raises(BatchError, match=r"pos\[6\] = 3: the positions of sequence 0 decrease"):
        alloc(b)


def test_sequence_sets_may_only_narrow():
    # llama.cpp's example: token 2 = {1, 2} after seq 1 was narrowed to {0, 1}
    b = Batch(tokens=[1, 2, 3], pos=[0, 1, 1], seq_ids=[[0, 1, 2], [0, 1], [1, 2]])
    with pytest.raises(BatchError, match=r"seq_ids\[2\] .* incompatible") as e:
        alloc(b)
    assert e.value.index == 2
    alloc(Batch(tokens=[1, 2, 3], seq_ids=[[0, 1, 2], [0, 1], [0]]))


def test_coupled_sequences_must_not_have_diverged_in_memory():
    b = Batch(tokens=[1], seq_ids=[[0, 1]])
    with pytest.raises(BatchError, match="coupled"):
        alloc(b, memory=FakeMemory({0: (0, 4), 1: (2, 4)}))
    assert alloc(b, memory=FakeMemory({0: (0, 4), 1: (0, 4)})).pos.tolist() == [5]


# -- splitting ---------------------------------------------------------------------------------

def test_split_simple_takes_consecutive_tokens():
    ab = alloc(Batch.from_tokens(list(range(10)), logits_all=True))
    ubs = ab.split_all(4, "simple")
    assert [u.idxs.tolist() for u in ubs] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [u.tokens.tolist() for u in ubs][2] == [8, 9]
    assert [u.pos.tolist() for u in ubs][1] == [4, 5, 6, 7]
    assert all(not u.equal_seqs and u.n_seqs == u.n_tokens and u.n_seq_tokens == 1 for u in ubs)
    assert ab.out_ids == list(range(10))
    assert ab.split_simple(4) is None


def test_split_simple_output_ids_with_last_token_default():
    ab = alloc(Batch(tokens=[1, 2, 3, 4, 5], seq_ids=[0, 1, 0, 1, 0]))
    ubs = ab.split_all(2, "simple")
    assert [u.n_outputs for u in ubs] == [0, 0, 1]
    assert ubs[2].out_ids.tolist() == [4] and ab.out_ids == [4]


def test_split_equal_three_sequences_of_different_lengths():
    # seq 0: idx 0 3 6 8, seq 1: idx 1 4, seq 2: idx 2 5 7
    ab = alloc(Batch(tokens=list(range(9)), seq_ids=[0, 1, 2, 0, 1, 2, 0, 2, 0],
                     logits=[True] * 9))
    ubs = ab.split_all(6, "equal")
    assert [u.idxs.tolist() for u in ubs] == [[0, 3, 1, 4, 2, 5], [6, 7], [8]]
    assert [(u.n_seqs, u.n_seq_tokens) for u in ubs] == [(3, 2), (2, 1), (1, 1)]
    assert ubs[0].seq_ids == [(0,), (0,), (1,), (1,), (2,), (2,)]
    assert ubs[0].pos.tolist() == [0, 1, 0, 1, 0, 1]
    assert ubs[1].seq_id_unq == [0, 2] and ubs[1].seq_idx == {0: 0, 2: 1}
    assert all(u.equal_seqs for u in ubs)
    # outputs are listed in ubatch order; sorting them restores the batch order
    assert ab.out_ids == [0, 3, 1, 4, 2, 5, 6, 7, 8]


def test_split_equal_round_fits_n_ubatch():
    # 2 seqs of 4 tokens, n_ubatch 5: 2 rounds (4 tokens) since a third would need 6
    ab = alloc(Batch(tokens=list(range(8)), seq_ids=[0, 1] * 4))
    ubs = ab.split_all(5, "equal")
    assert [u.idxs.tolist() for u in ubs] == [[0, 2, 1, 3], [4, 6, 5, 7]]


def test_split_equal_caps_sequence_sets_at_n_ubatch():
    ab = alloc(Batch(tokens=[1, 2, 3], seq_ids=[0, 1, 2]))
    ubs = ab.split_all(2, "equal")
    assert [u.idxs.tolist() for u in ubs] == [[0, 1], [2]]
    assert max(u.n_tokens for u in ubs) <= 2


def test_split_equal_puts_a_shared_prompt_in_its_own_ubatch():
    ab = alloc(Batch(tokens=[1, 2, 3, 4], seq_ids=[[0, 1], [0, 1], [0], [1]]))
    ubs = ab.split_all(8, "equal")
    assert [u.idxs.tolist() for u in ubs] == [[0, 1], [2, 3]]
    assert (ubs[0].n_seqs, ubs[0].n_seq_tokens, ubs[0].seq_id_unq) == (1, 2, [0, 1])
    assert ubs[0].n_seq_id.tolist() == [2, 2]
    assert (ubs[1].n_seqs, ubs[1].n_seq_tokens) == (2, 1)


def test_split_equal_sequential_needs_consecutive_ids_and_no_coupling():
    ab = alloc(Batch(tokens=[1, 2, 3], seq_ids=[0, 2, 1]))
    ubs = ab.split_all(8, "equal", sequential=True)
    assert [u.idxs.tolist() for u in ubs] == [[0, 2], [1]]
    coupled = alloc(Batch(tokens=[1, 2], seq_ids=[[0, 1], [0]]))
    assert coupled.split_equal(8, sequential=True) is None
    assert coupled.split_all(8, "equal", sequential=True) is None
    assert coupled.split_all(8, "equal") is not None


def test_split_seq_follows_a_narrowing_sequence_set():
    ab = alloc(Batch(tokens=[1, 2, 3, 4, 5], seq_ids=[[0, 1], [0, 1], [0], [1], [0]]))
    ubs = ab.split_all(8, "seq")
    assert [u.idxs.tolist() for u in ubs] == [[0, 1, 2, 4], [3]]
    assert all(u.n_seqs == 1 and u.n_seq_tokens == u.n_tokens for u in ubs)
    ab.split_reset()
    assert ab.split_seq(2).idxs.tolist() == [0, 1]
    assert ab.split_seq(2).idxs.tolist() == [2, 4]
    assert ab.split_seq(2).idxs.tolist() == [3]
    assert ab.split_seq(2) is None


def test_split_embeddings_rows_follow_tokens():
    embd = np.arange(10, dtype=np.float32).reshape(5, 2)
    ab = alloc(Batch(embd=embd, seq_ids=[0, 1, 0, 1, 0]))
    ub = ab.split_all(8, "equal")[0]
    assert ub.tokens is None
    np.testing.assert_array_equal(ub.embd, embd[[0, 2, 1, 3]])


def test_split_arguments():
    ab = alloc(Batch(tokens=[1]))
    with pytest.raises(ValueError, match="n_ubatch"):
        ab.split_simple(0)
    with pytest.raises(ValueError, match="unknown split mode"):
        ab.split_all(4, "fast")


def test_ubatch_reserve_shape():
    ub = UBatch.reserve(n_seq_tokens=3, n_seqs=2)
    assert (ub.n_tokens, ub.n_seqs, ub.n_seq_tokens, ub.seq_id_unq) == (6, 2, 3, [0, 1])
