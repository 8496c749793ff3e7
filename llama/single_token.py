"""The ubatch of a generation step, without the general allocator and splitter.

Generation decodes one token per sequence per step: `Batch.from_tokens([t], seq_id=s)`
alone, or, in a server's step (batched decode), one token of each of several sequences.
The general path (`BatchAllocator.init`, then `split_all`) validates and splits any batch
with numpy bookkeeping sized for prompts (about 60 µs for a step of 4 sequences); for this
one shape the result is known in advance: one ubatch holding each token at the next
position of its sequence, in batch order.
"""
from __future__ import annotations

import numpy as np

from llama.batch import LLAMA_MAX_SEQ, Batch, SeqPosMemory, UBatch


def generation_ubatch(batch: Batch, n_vocab: int, n_seq_max: int, memory: SeqPosMemory,
                      n_max: int, output_all: bool = False) -> UBatch | None:
    """The ubatch of a batch of one token per sequence, built directly: the same UBatch as
    `BatchAllocator.init` followed by a simple split (the KV cache is one stream), without
    their general bookkeeping. `n_max` is the most tokens one ubatch may hold (n_batch and
    n_ubatch); `output_all` as the allocator's (an embeddings context).

    Only a batch that is valid at a glance takes this path: a list of at most n_max int
    tokens in range, each of a different sequence (one id each, in range; no ids: one token
    of sequence 0), positions absent or each the next of its sequence, output flags absent
    or all True. Anything else gives None, and the allocator validates it (and rejects it
    with its errors) as usual.
    """
    tokens = batch.tokens
    if (type(tokens) is not list or not 1 <= len(tokens) <= n_max or batch.embd is not None
            or not 1 <= n_seq_max <= LLAMA_MAX_SEQ):
        return None
    for tok in tokens:
        if type(tok) is not int and not isinstance(tok, np.integer):  # bools are not tokens
            return None
        if not 0 <= tok < n_vocab:
            return None
    n = len(tokens)
    output = _outputs(batch.logits, n, output_all)
    if output is None:
        return None
    seqs = _distinct_seqs(batch.seq_ids, n, n_seq_max)
    if seqs is None:
        return None
    pos = [memory.seq_pos_max(s) + 1 for s in seqs]
    given = batch.pos
    if given is not None and (type(given) is not list or any(type(p) is not int for p in given)
                              or given != pos):
        return None   # positions that do not continue their sequences: the allocator says why
    return UBatch(tokens=np.array(tokens, dtype=np.int32), embd=None,
                  pos=np.array(pos, dtype=np.int32), seq_ids=[(s,) for s in seqs],
                  output=output, idxs=_FIRST_INDEX if n == 1 else np.arange(n, dtype=np.int64),
                  n_seq_tokens=1, n_seqs=n, equal_seqs=False, seq_id_unq=sorted(seqs))


def _outputs(logits, n: int, output_all: bool) -> np.ndarray | None:
    """Output flags: absent marks the last token (every token with output_all), a list of
    True marks all; anything else is the allocator's to read."""
    if logits is None:
        if n == 1 or output_all:
            return _ONE_OUTPUT if n == 1 else np.ones(n, bool)
        out = np.zeros(n, bool)
        out[-1] = True
        return out
    if type(logits) is not list or len(logits) != n or any(flag is not True for flag in logits):
        return None
    return _ONE_OUTPUT if n == 1 else np.ones(n, bool)


def _distinct_seqs(seq_ids, n: int, n_seq_max: int) -> list[int] | None:
    """One sequence id per token, all different and in range; None otherwise."""
    if seq_ids is None:
        return [0] if n == 1 else None
    if type(seq_ids) is not list or len(seq_ids) != n:
        return None
    seqs = []
    for entry in seq_ids:
        if type(entry) in (list, tuple):
            if len(entry) != 1:
                return None
            entry = entry[0]
        if type(entry) is not int or not 0 <= entry < n_seq_max:
            return None
        seqs.append(entry)
    return seqs if len(set(seqs)) == n else None


def _constant(values, dtype) -> np.ndarray:
    a = np.array(values, dtype=dtype)
    a.flags.writeable = False
    return a


_ONE_OUTPUT = _constant([True], bool)   # shared by every one-token ubatch: read-only
_FIRST_INDEX = _constant([0], np.int64)
