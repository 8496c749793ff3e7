"""How a hop's activations travel: as direct actor-call arguments and return values, cut
into pieces small enough for Ray to inline.

Ray sends an argument or return value under `max_direct_call_object_size` (100 KiB by
default) inside the call's own message; a larger one goes through the object store of the
node that made it, and the reader pulls it from there: a second transfer, plus a
node-to-node object push (bench/bench_ray_split.py measured ~15 ms for 256 KiB on this
machine's loopback cluster, against ~1.3 ms for an inlined call). A decode step's logits
are n_vocab floats (192 KiB for SmolLM2), so each array is sent as pieces of at most
PIECE bytes, each its own top-level argument or return value: every piece is inlined,
up to Ray's per-call inline budget (`task_rpc_inlined_bytes_limit`, 10 MiB); beyond it Ray
moves the rest through the object store by itself, still correct. Cutting costs one copy
on the side that joins the pieces (a few microseconds per hundred KiB).

Every call carries one buffer each way: a hop's arrays are packed back to back (`pack`,
one copy of a few KiB; a call with one argument per array cost ~2 ms to submit here, one
with a single buffer ~0.5 ms), then cut. Both sides compute the result's size from the
same tensors and env (`piece_count`), so the host knows how many return values to ask
for (`num_returns`) before the call.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

PIECE = 96 << 10  # under Ray's 100 KiB inline limit, with room for the pickle framing


def piece_count(nbytes: int) -> int:
    """How many pieces an array of `nbytes` travels as (at least one, even when empty)."""
    return max(1, -(-int(nbytes) // PIECE))


def pack(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays' bytes back to back in one uint8 array (the array itself when it is one)."""
    raws = [a.reshape(-1).view(np.uint8) for a in arrays]
    if len(raws) == 1:
        return raws[0]
    return np.concatenate(raws) if raws else np.zeros(0, np.uint8)


def cut(data: np.ndarray) -> list[np.ndarray]:
    """`data`'s bytes as piece_count(nbytes) uint8 views (no copy)."""
    raw = data.reshape(-1).view(np.uint8)
    return [raw[i * PIECE:(i + 1) * PIECE] for i in range(piece_count(raw.nbytes))]


def join(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """One uint8 array from pieces: the piece itself when there is one (no copy)."""
    if len(pieces) == 1:
        return pieces[0].reshape(-1).view(np.uint8)
    return np.concatenate([p.reshape(-1).view(np.uint8) for p in pieces])
