"""The ubatch of a decode step, without the general allocator and splitter.

Generation decodes `Batch.from_tokens([t], seq_id=s)` once per token. The general path
(`BatchAllocator.init`, then `split_all`) validates and splits any batch with numpy
bookkeeping sized for prompts; for this one shape the result is known in advance: one
ubatch holding the token at the next position of its sequence, output flagged.
"""
from __future__ import annotations

import numpy as np

from llama.batch import LLAMA_MAX_SEQ, Batch, SeqPosMemory, UBatch


def single_token_ubatch(batch: Batch, n_vocab: int, n_seq_max: int, memory: SeqPosMemory) -> UBatch | None:
    """The ubatch of a plain one-token batch (`Batch.from_tokens([t], seq_id=s)`, every step
    of generation), built directly: the same UBatch as `BatchAllocator.init` followed by a
    simple split (the KV cache is one stream), without their general bookkeeping.

    Only a batch that is valid at a glance takes this path: one int token in range, at most
    one sequence id in range, no positions (they continue the memory, so they are
    continuous), no output flags or a single True. Anything else gives None, and the
    allocator validates it (and rejects it with its errors) as usual.
    """
    tokens = batch.tokens
    if (type(tokens) is not list or len(tokens) != 1 or batch.embd is not None
            or batch.pos is not None or not 1 <= n_seq_max <= LLAMA_MAX_SEQ):
        return None
    tok = tokens[0]
    if type(tok) is not int and not isinstance(tok, np.integer):  # bools are not tokens
        return None
    if not 0 <= tok < n_vocab:
        return None
    logits = batch.logits
    if logits is not None and not (type(logits) is list and len(logits) == 1 and logits[0] is True):
        return None
    seq = 0
    if batch.seq_ids is not None:
        seq_ids = batch.seq_ids
        if type(seq_ids) is not list or len(seq_ids) != 1:
            return None
        entry = seq_ids[0]
        if type(entry) in (list, tuple):
            if len(entry) != 1:
                return None
            entry = entry[0]
        if type(entry) is not int or not 0 <= entry < n_seq_max:
            return None
        seq = entry
    pos = memory.seq_pos_max(seq) + 1
    return UBatch(tokens=np.array([tok], dtype=np.int32), embd=None,
                  pos=np.array([pos], dtype=np.int32), seq_ids=[(seq,)],
                  output=_ONE_OUTPUT, idxs=_FIRST_INDEX,
                  n_seq_tokens=1, n_seqs=1, equal_seqs=False, seq_id_unq=[seq])


def _constant(values, dtype) -> np.ndarray:
    a = np.array(values, dtype=dtype)
    a.flags.writeable = False
    return a


_ONE_OUTPUT = _constant([True], bool)   # shared by every one-token ubatch: read-only
_FIRST_INDEX = _constant([0], np.int64)
