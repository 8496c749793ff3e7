"""`embed` / `create_embedding`: texts in, pooled (or per-token) hidden states out.

Inputs are packed several to a decode, one sequence each (up to `EMBED_SEQS` sequences and
`n_batch` tokens), and the context pools each sequence on its own (llama.pooling). With
pooling `none` every input gives one vector per token, as llama-cpp-python returns them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llama.api import responses
from llama.api.engine import DecodeError
from llama.batch import Batch
from llama.pooling import PoolingType

if TYPE_CHECKING:
    from llama.api.llama import Llama

EMBED_SEQS = 8  # sequences an embedding context packs into one decode


def _inputs(input) -> tuple[list, bool]:
    """(list of texts or token lists, whether one input was given)."""
    if isinstance(input, str):
        return [input], True
    if isinstance(input, list) and input and all(isinstance(t, int) for t in input):
        return [input], True
    if not isinstance(input, list):
        raise ValueError("input must be a string, a list of strings or a list of token lists")
    return list(input), False


def embed(llm: "Llama", input, *, normalize: bool = False, truncate: bool = True,
          return_count: bool = False):
    """llama-cpp-python's `embed`: one vector per input (a list of per-token vectors with
    pooling none), L2-normalised with `normalize`; `return_count` adds the token count."""
    if not llm.embedding:
        raise RuntimeError("Llama model must be created with embedding=True to call this method")
    ctx = llm.ctx
    items, single = _inputs(input)
    token_lists = []
    for i, item in enumerate(items):
        ids = llm.tokenize(item, add_bos=True, special=False) if isinstance(item, str) else list(item)
        if not ids:
            raise ValueError(f"input[{i}] is empty")
        if len(ids) > ctx.n_batch:
            if not truncate:
                raise ValueError(f"input[{i}] has {len(ids)} tokens, more than n_batch "
                                 f"({ctx.n_batch}); pass truncate=True to cut it")
            ids = ids[:ctx.n_batch]
        token_lists.append(ids)
    results: list = []
    group: list[list[int]] = []
    for ids in token_lists:
        if group and (len(group) == min(EMBED_SEQS, ctx.n_seq_max)
                      or sum(map(len, group)) + len(ids) > ctx.n_batch):
            results += _decode_group(llm, group)
            group = []
        group.append(ids)
    if group:
        results += _decode_group(llm, group)
    if normalize:
        results = [_l2(r) for r in results]
    data = [r.tolist() for r in results]
    n_tokens = sum(map(len, token_lists))
    out = data[0] if single else data
    return (out, n_tokens) if return_count else out


def _decode_group(llm: "Llama", group: list[list[int]]) -> list[np.ndarray]:
    ctx = llm.ctx
    llm.engine.reset()  # embeddings start from an empty cache, as llama-cpp-python's
    llm._generation += 1
    tokens, seq_ids, pos = [], [], []
    for s, ids in enumerate(group):
        tokens += ids
        seq_ids += [[s]] * len(ids)
        pos += list(range(len(ids)))
    rc = ctx.decode(Batch(tokens=tokens, pos=pos, seq_ids=seq_ids))
    if rc != 0:
        llm.engine.reset()
        raise DecodeError(rc, "embedding input")
    if ctx.pooling_type == PoolingType.NONE:
        rows = ctx.get_embeddings()
        out, start = [], 0
        for ids in group:
            out.append(np.array(rows[start:start + len(ids)]))
            start += len(ids)
    else:
        out = [np.array(ctx.get_embeddings_seq(s)) for s in range(len(group))]
    llm.engine.reset()
    return out


def _l2(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.maximum(norm, 1e-12)


def normalize(v, embd_normalize: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize, what llama-server's `embd_normalize` asks for:
    -1 none, 0 max absolute value scaled to the int16 range, 1 taxicab, 2 Euclidean (its
    default), p > 2 the p-norm. Sums in float64, as llama.cpp's; a zero vector stays zero."""
    x = np.asarray(v, dtype=np.float32)
    if embd_normalize == -1:
        return x
    if embd_normalize == 0:
        total = float(np.abs(x).max(initial=0.0)) / 32760.0
    elif embd_normalize == 2:
        total = float(np.sqrt(np.sum(x.astype(np.float64) ** 2)))
    else:
        p = float(embd_normalize)
        total = float(np.sum(np.abs(x.astype(np.float64)) ** p) ** (1.0 / p))
    return x * np.float32(1.0 / total if total > 0 else 0.0)


def embed_each(llm: "Llama", input) -> tuple[list, int]:
    """`embed`'s vectors as a list with one entry per input, whether `input` is one input
    or several, and the token count."""
    data, n_tokens = embed(llm, input, normalize=False, return_count=True)
    _, single = _inputs(input)
    return ([data] if single else data), n_tokens


def create_embedding(llm: "Llama", input, *, model: str | None = None) -> dict:
    """OpenAI's embeddings response (a `list` of `embedding` objects with usage)."""
    vectors, n_tokens = embed_each(llm, input)
    return responses.embeddings(vectors, model or llm.model_path, n_tokens)
