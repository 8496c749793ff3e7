"""How a hop's activations travel: one message of `bytes` pieces, as direct actor-call
arguments and return values.

Measured on a two-node loopback cluster on a 2-vCPU machine (Ray 2.60,
bench/bench_ray_split.py's hop_cost), round trips of an actor call:

- Ray serialises a numpy argument with its own out-of-band machinery, about 1 ms a round
  trip more than the same bytes as a `bytes` object (4.8 KiB: 2.1–2.3 ms against 1.1–1.3;
  192 KiB in three pieces: 3.9 against 2.5 ms). Every further argument costs too (four small
  Python values added 0.4 ms). So a hop is one message: a small header (the call's Python
  values, pickled) and the arrays' bytes back to back, as `bytes`.
- Ray sends an argument or return value under `max_direct_call_object_size` (100 KiB) inside
  the call's own message; a larger one goes through the object store of the node that made
  it, and the reader pulls it from there (about 13–17 ms here, whatever the size). A message
  is therefore cut into pieces of at most PIECE bytes, each its own argument or return value,
  all inlined up to Ray's per-call budget (`task_rpc_inlined_bytes_limit`, 10 MiB); beyond it
  Ray moves the rest through the object store by itself, still correct.

Building a message copies the arrays once (microseconds for the KiB a decode step moves, tens
for a row of logits), and once more when it is cut into pieces; reading one joins the pieces (a copy only when there are several) and
views the payload without copying (read-only, as Ray's own buffers are). Both sides compute a
result's size from the same tensors and env (`message_size`, RESULT_HEAD), so the host knows how many
return values to ask for (`num_returns`) before the call.
"""
from __future__ import annotations

import pickle
import struct
from typing import Any, Sequence

import numpy as np

PIECE = 96 << 10  # under Ray's 100 KiB inline limit, with room for the pickle framing
_HEAD_LENGTH = struct.Struct("<I")


def piece_count(nbytes: int) -> int:
    """How many pieces a message of `nbytes` travels as (at least one, even when empty)."""
    return max(1, -(-int(nbytes) // PIECE))


def message_size(head_bytes: int, payload_bytes: int) -> int:
    """Bytes of the message `message(head, arrays)` makes for a head of `head_bytes` and
    arrays of `payload_bytes`."""
    return _HEAD_LENGTH.size + int(head_bytes) + int(payload_bytes)


def message(head: bytes, arrays: Sequence[np.ndarray]) -> list[bytes]:
    """`head` (a few bytes of the call's own values), then every array's bytes back to back,
    as the pieces Ray inlines."""
    data = b"".join([_HEAD_LENGTH.pack(len(head)), head,
                     *(memoryview(a.reshape(-1).view(np.uint8)) for a in arrays)])
    if len(data) <= PIECE:
        return [data]
    return [data[i:i + PIECE] for i in range(0, len(data), PIECE)]


def unpack(pieces: Sequence[bytes]) -> tuple[bytes, np.ndarray]:
    """A message's head and its payload (uint8, read-only, no copy of a one-piece message)."""
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    (n,) = _HEAD_LENGTH.unpack_from(data, 0)
    start = _HEAD_LENGTH.size
    return data[start:start + n], np.frombuffer(data, np.uint8, offset=start + n)


def call_head(values: Any) -> bytes:
    """A request's head: the call's small Python values (split id, env, threads, layout)."""
    return pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)


def read_call_head(head: bytes) -> Any:
    return pickle.loads(head)


RESULT_HEAD = struct.Struct("<dd")  # (seconds in native code, seconds in the actor's call)
