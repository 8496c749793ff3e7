"""A hop's message (ggmlpy/distributed/hops.py): what goes in comes out, byte for byte, in
as many pieces as both sides compute, each small enough for Ray to inline. No Ray needed."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ggmlpy.distributed.hops import (
    PIECE, RESULT_HEAD, call_head, message, message_size, piece_count, read_call_head, unpack,
)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 3 * PIECE // 2), max_size=4), head_len=st.integers(0, 300),
       seed=st.integers(0, 2**32 - 1))
def test_a_message_round_trips_in_the_pieces_its_size_predicts(sizes, head_len, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    head = rng.integers(0, 256, head_len, dtype=np.uint8).tobytes()
    pieces = message(head, arrays)
    assert all(type(p) is bytes and len(p) <= PIECE for p in pieces)
    assert len(pieces) == piece_count(message_size(len(head), sum(sizes)))
    got_head, payload = unpack(pieces)
    assert got_head == head
    assert payload.tobytes() == b"".join(a.tobytes() for a in arrays)


def test_arrays_of_any_type_travel_as_their_bytes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([-1, 7], dtype=np.int64)
    _, payload = unpack(message(b"", [x, y]))
    assert np.array_equal(payload[:x.nbytes].view(np.float32).reshape(3, 4), x)
    assert np.array_equal(payload[x.nbytes:].view(np.int64), y)


def test_a_row_of_logits_is_three_pieces_and_the_result_head_is_fixed():
    logits = np.linspace(-5, 5, 49152, dtype=np.float32)  # SmolLM2's n_vocab
    pieces = message(RESULT_HEAD.pack(0.25, 0.5), [logits])
    assert len(pieces) == 3 == piece_count(message_size(RESULT_HEAD.size, logits.nbytes))
    head, payload = unpack(pieces)
    assert RESULT_HEAD.unpack(head) == (0.25, 0.5)
    assert np.array_equal(payload.view(np.float32), logits)


def test_a_call_head_keeps_the_calls_values():
    values = (3, {"n_tokens": 1, "n_kv": 256}, 2, [(17, 2304), (18, 4)])
    assert read_call_head(call_head(values)) == values
